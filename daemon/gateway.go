package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/sshgw"
	"github.com/denhq/den/users"
)

// DefaultSSHListen is where the SSH gateway listens unless told
// otherwise.
const DefaultSSHListen = "0.0.0.0:2222"

// gateway is the daemon's SSH gateway, if it runs.
type gateway struct {
	srv         *sshgw.Server
	addr        string // "" when off
	fingerprint string
}

// startGateway starts the SSH gateway on o.SSHListen ("" or "off": none)
// with the daemon's gateway host key, backed by m; `ssh den@host` runs
// o.Den in this process against the API, through inproc, as the key's
// user.
func startGateway(o Options, m Sessions, keys users.Keys, hostKey ssh.Signer, inproc *inProcess, log *audit.Log) (*gateway, error) {
	if o.SSHListen == "" || o.SSHListen == "off" {
		o.Logger.Info("den: ssh gateway off")
		return &gateway{}, nil
	}
	cfg := sshgw.Config{HostKey: hostKey, Backend: gatewayBackend{m, keys, log, o.Logger}, Logger: o.Logger}
	if o.Den != nil {
		cfg.Den = &sshgw.DenCommand{Run: func(ctx context.Context, user, source string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
			caller := Caller{User: user, Source: "ssh " + source}
			client := api.NewDialClient("the den daemon", func(ctx context.Context) (net.Conn, error) {
				return inproc.dial(ctx, caller)
			})
			start := time.Now()
			status := o.Den(ctx, client, args, stdin, stdout, stderr)
			writeAudit(log, o.Logger, audit.Record{Time: start.UTC(), User: user, Source: caller.Source, Verb: "den@ " + args[0],
				Result: exitResult(status), Duration: time.Since(start)})
			return status
		}}
	} else {
		o.Logger.Warn("den: ssh gateway: den@ commands off (no runner)")
	}
	srv, err := sshgw.Listen(o.SSHListen, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (choose another with --ssh-listen ADDR, or off)", err)
	}
	g := &gateway{srv: srv, addr: srv.Addr().String(), fingerprint: srv.Fingerprint()}
	o.Logger.Info("den: ssh gateway", "addr", g.addr, "fingerprint", g.fingerprint)
	return g, nil
}

// close stops the gateway and ends its connections.
func (g *gateway) close() {
	if g.srv != nil {
		_ = g.srv.Close()
	}
}

// gatewayBackend gives the gateway the registry's keys and the
// manager's VMs.
type gatewayBackend struct {
	m     Sessions
	keys  users.Keys
	audit *audit.Log
	log   *slog.Logger
}

func (b gatewayBackend) UserForKey(ctx context.Context, fingerprint string) (string, error) {
	u, err := b.keys.UserFor(ctx, fingerprint)
	if errors.Is(err, users.ErrNotFound) {
		return "", fmt.Errorf("%w: %w", err, sshgw.ErrUnknownKey)
	}
	return u, err
}

func (b gatewayBackend) Open(ctx context.Context, vm, user string) (*sshgw.Upstream, error) {
	if err := validate.VMName(vm); err != nil {
		return nil, err
	}
	if err := validate.User(user); err != nil {
		return nil, err
	}
	octx, cancel := detach(ctx) // a wake, once started, finishes
	defer cancel()
	s, err := b.m.Open(octx, vm, user)
	if errors.Is(err, machine.ErrNotFound) {
		return nil, fmt.Errorf("%w: %w", err, sshgw.ErrNoVM)
	}
	if err != nil {
		return nil, err
	}
	s.Tag(user+" (ssh gateway)", "gateway")
	start := time.Now()
	release := func() {
		s.Release()
		writeAudit(b.audit, b.log, audit.Record{Time: start.UTC(), User: user, Source: "ssh", Verb: "ssh session", VM: vm,
			Result: "ok", Duration: time.Since(start)})
	}
	return &sshgw.Upstream{Conn: s.Conn, Done: s.Done, Release: release}, nil
}
