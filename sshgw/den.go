package sshgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	shlex "github.com/anmitsu/go-shlex"
	gossh "golang.org/x/crypto/ssh"
)

// DefaultDenVerbs are the verbs `ssh den@host` runs: those that act on
// the daemon only through its API, where the key's user scopes what they
// see and touch. Verbs that work on the host itself (daemon, doctor) are
// not among them, nor ssh (use `ssh VM@host`, which has a terminal).
// Verbs this den does not have yet are harmless: den says so.
var DefaultDenVerbs = []string{
	"ls", "info", "create", "rm", "exec", "logs", "keys",
	"sleep", "wake", "resize", "checkpoint", "checkpoints", "restore", "fork", "help",
}

// EnvRemote is set (to "1") in the environment of den verbs run for the
// gateway: verbs that would read the host's files refuse to.
const EnvRemote = "DEN_REMOTE"

// DenCommand runs den verbs for `ssh den@host VERB ARGS`.
type DenCommand struct {
	// Binary is the den executable (the daemon's own).
	Binary string
	// Socket is the daemon's API socket.
	Socket string
	// Verbs allowed (nil: DefaultDenVerbs).
	Verbs []string
}

// DenArgs splits an SSH command line into den's arguments, shell-like
// (quotes and backslashes; no expansion, no shell), and checks it: the
// first word must be an allowed verb (or --help, --version), and no
// --socket flag may send den elsewhere.
func (d *DenCommand) DenArgs(cmdline string) ([]string, error) {
	args, err := shlex.Split(cmdline, true)
	if err != nil {
		return nil, fmt.Errorf("cannot split the command: %w", err)
	}
	verbs := d.Verbs
	if verbs == nil {
		verbs = DefaultDenVerbs
	}
	usage := "usage: ssh -p PORT " + DenUser + "@HOST VERB [ARGS] (verbs: " + strings.Join(verbs, ", ") + ")"
	if len(args) == 0 {
		return nil, errors.New(usage)
	}
	switch args[0] {
	case "--help", "-h", "--version", "-v":
		if len(args) > 1 {
			return nil, errors.New(usage)
		}
		return args, nil
	}
	if !slices.Contains(verbs, args[0]) {
		return nil, fmt.Errorf("%q cannot be run through the gateway; %s", args[0], usage)
	}
	for _, a := range args[1:] {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "socket" {
			return nil, errors.New("--socket cannot be given through the gateway")
		}
	}
	return args, nil
}

// serve runs one session channel of a den@ connection: it waits for the
// command, runs den with it for user, and passes back stdin, stdout,
// stderr and the exit status.
func (d *DenCommand) serve(ctx context.Context, nc gossh.NewChannel, user string, log *slog.Logger) {
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
	args, err := d.DenArgs(cmdline)
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "den: %v\n", err)
	} else {
		log.Info("den: gateway den command", "user", user, "args", args)
		status = d.run(ctx, ch, user, args)
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

// run runs den and returns its exit status.
func (d *DenCommand) run(ctx context.Context, ch gossh.Channel, user string, args []string) int {
	cmd := exec.CommandContext(ctx, d.Binary, args...)
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"DEN_SOCKET=" + d.Socket,
		"DEN_OWNER=" + user,
		EnvRemote + "=1",
	}
	cmd.Dir = "/"
	cmd.Stdout = ch
	cmd.Stderr = ch.Stderr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "den: cannot run den: %v\n", err)
		return 255
	}
	go func() {
		_, _ = io.Copy(stdin, ch)
		_ = stdin.Close()
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	fmt.Fprintf(ch.Stderr(), "den: %v\n", err)
	return 255
}
