package sshgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	shlex "github.com/anmitsu/go-shlex"
	gossh "golang.org/x/crypto/ssh"
)

// DenRunner runs one den command line for a remote user, in the
// daemon's own process: as user, whose key the gateway verified, from
// source (the client's address). It returns the exit status. The daemon's
// runner calls its API as that user, over the same handlers as its
// socket, and lets no verb or flag name a host file or another daemon.
type DenRunner func(ctx context.Context, user, source string, args []string, stdin io.Reader, stdout, stderr io.Writer) int

// DenCommand runs den verbs for `ssh den@host VERB ARGS`.
type DenCommand struct {
	// Run runs a command line (split, without the program's name).
	Run DenRunner
}

// DenArgs splits an SSH command line into den's arguments, shell-like
// (quotes and backslashes; no expansion, no shell). Which verbs and flags
// may run is the runner's to check.
func DenArgs(cmdline string) ([]string, error) {
	args, err := shlex.Split(cmdline, true)
	if err != nil {
		return nil, fmt.Errorf("cannot split the command: %w", err)
	}
	if len(args) == 0 {
		return nil, errors.New("usage: ssh -p PORT " + DenUser + "@HOST VERB [ARGS] (ssh -p PORT " + DenUser + "@HOST help: the verbs)")
	}
	return args, nil
}

// serve runs one session channel of a den@ connection: it waits for the
// command, runs den with it for user, and passes back stdin, stdout,
// stderr and the exit status.
func (d *DenCommand) serve(ctx context.Context, nc gossh.NewChannel, user, source string, log *slog.Logger) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmdline, ok := waitCommand(ctx, reqs)
	if !ok {
		return
	}
	go func() {
		for req := range reqs {
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
		cancel() // the client closed the channel
	}()
	status := 2
	args, err := DenArgs(cmdline)
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "den: %v\n", err)
	} else {
		log.Info("den: gateway den command", "user", user, "args", args)
		status = d.Run(ctx, user, source, args, ch, ch, ch.Stderr())
	}
	_, _ = ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{uint32(status)}))
	_ = ch.CloseWrite()
}

// waitCommand takes a session's requests until its exec (or shell: an
// empty command). No pty: den verbs here are not interactive.
func waitCommand(ctx context.Context, reqs <-chan *gossh.Request) (string, bool) {
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				return "", false
			}
			switch req.Type {
			case "exec":
				var p struct{ Command string }
				if err := gossh.Unmarshal(req.Payload, &p); err != nil {
					_ = req.Reply(false, nil)
					continue
				}
				_ = req.Reply(true, nil)
				return p.Command, true
			case "shell":
				_ = req.Reply(true, nil)
				return "", true
			default: // pty-req, env, subsystem, auth-agent-req...
				if req.WantReply {
					_ = req.Reply(false, nil)
				}
			}
		case <-timeout.C:
			return "", false
		case <-ctx.Done():
			return "", false
		}
	}
}
