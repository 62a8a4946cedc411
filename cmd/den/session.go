package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/crypto/ssh"
	"golang.org/x/term"

	"github.com/denhq/den/agent"
)

// sessionOptions is what exec and ssh ask of a remote session.
type sessionOptions struct {
	cmd     string // empty: the login shell
	tty     bool
	env     []string
	workdir string
}

// runSession runs a command (or shell) in a VM through the daemon and
// returns its exit status as a cli exit error (nil for 0).
func runSession(ctx context.Context, c *cli.Context, name string, o sessionOptions) error {
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	client, err := cl.SSH(ctx, name)
	if err != nil {
		return err
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return fmt.Errorf("open session on %s: %w", name, err)
	}
	defer sess.Close()
	for _, kv := range o.env {
		k, v, ok := splitEnv(kv)
		if !ok {
			return fmt.Errorf("bad environment entry %q: use KEY=VALUE", kv)
		}
		if err := sess.Setenv(k, v); err != nil {
			return fmt.Errorf("set %s: %w", k, err)
		}
	}
	if o.workdir != "" {
		if err := sess.Setenv(agent.EnvWorkdir, o.workdir); err != nil {
			return fmt.Errorf("set working directory: %w", err)
		}
	}
	sess.Stdout, sess.Stderr = c.App.Writer, c.App.ErrWriter
	stdin, err := sess.StdinPipe()
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(stdin, c.App.Reader)
		_ = stdin.Close()
	}()
	if o.tty {
		restore, err := startTerminal(c, sess)
		if err != nil {
			return err
		}
		defer restore()
	}
	if o.cmd == "" {
		err = sess.Shell()
	} else {
		err = sess.Start(o.cmd)
	}
	if err != nil {
		return fmt.Errorf("start on %s: %w", name, err)
	}
	return exitStatus(sess.Wait())
}

// startTerminal asks for a PTY the size of ours, puts our terminal in raw
// mode and forwards window size changes; the returned func restores it.
// When stdin is not a file of this process (and always for the gateway,
// whose process is the daemon) the PTY is 80x24 for TERM xterm-256color
// and nothing else is done.
func startTerminal(c *cli.Context, sess *ssh.Session) (func(), error) {
	fd := stdinFd(c)
	cols, rows := 80, 24
	t := "xterm-256color"
	if fd >= 0 {
		if w, h, err := term.GetSize(fd); err == nil {
			cols, rows = w, h
		}
		if v := os.Getenv("TERM"); v != "" {
			t = v
		}
	}
	if err := sess.RequestPty(t, rows, cols, ssh.TerminalModes{ssh.ECHO: 1}); err != nil {
		return nil, fmt.Errorf("request pty: %w", err)
	}
	if fd < 0 {
		return func() {}, nil
	}
	var restore func()
	if term.IsTerminal(fd) {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return nil, err
		}
		restore = func() { _ = term.Restore(fd, old) }
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for range winch {
			if w, h, err := term.GetSize(fd); err == nil {
				_ = sess.WindowChange(h, w)
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(winch)
		if restore != nil {
			restore()
		}
	}, nil
}

// exitStatus turns the session's end into den's exit status: the
// command's own, 128+n for a signal.
func exitStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitStatus()
		if ee.Signal() != "" && code == 0 {
			code = 128 + signalNumber(ee.Signal())
		}
		return cli.Exit("", code)
	}
	var em *ssh.ExitMissingError
	if errors.As(err, &em) {
		return errors.New("the session ended without an exit status (the VM stopped or the connection broke)")
	}
	return err
}

func signalNumber(name string) int {
	for i := 1; i < 32; i++ {
		if unixSignalName(syscall.Signal(i)) == name {
			return i
		}
	}
	return 1
}

func splitEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], i > 0
		}
	}
	return "", "", false
}
