package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// ExecRequest describes a command to run in the guest.
type ExecRequest struct {
	// Cmd is the command and its arguments. They reach the program as
	// given: each word is quoted for the guest shell that runs it.
	Cmd []string
	// CmdLine is a shell command line, used when Cmd is empty.
	CmdLine string
	// Env is extra environment, "KEY=VALUE" each.
	Env []string
	// Dir is the working directory (default: the user's home).
	Dir string
	// Stdin, Stdout and Stderr are the command's streams; nil means
	// empty input and discarded output. With TTY, stderr arrives on
	// Stdout. A Stdin that never returns keeps a goroutine until it does.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// TTY runs the command on a pseudo-terminal of Rows x Cols (default
	// 24x80) with TERM=Term (default xterm-256color).
	TTY  bool
	Term string
	Rows int
	Cols int
	// Resize, if set, delivers terminal size changes.
	Resize <-chan WindowSize
	// Keep leaves the command running in the guest when this session
	// ends before it does (see EnvKeep); its output is dropped then.
	Keep bool
	// Session names the den session the command belongs to in the
	// activity record (see EnvSession); empty: none.
	Session string
}

// MaxCommandLine is the longest command line, in bytes, that the guest
// can run: it runs "shell -c LINE", and Linux refuses one argument of 128
// KiB or more (MAX_ARG_STRLEN, its NUL included) with E2BIG. Longer lines
// are refused before they are sent (SSH refuses packets over 256 KiB by
// closing the connection: a bare EOF). Large data goes on stdin.
const MaxCommandLine = 128<<10 - 1

// commandLine is the string sent in the SSH exec request.
func (r ExecRequest) commandLine() string {
	if len(r.Cmd) > 0 {
		return QuoteCommand(r.Cmd)
	}
	return r.CmdLine
}

// Exec runs a command and returns its exit status: the program's own, or
// 128+n when it was killed by signal n. err is set only when the command
// could not be run or its status is unknown (the connection broke). When
// ctx ends the command is killed (SIGKILL to its process group).
func (c *Client) Exec(ctx context.Context, req ExecRequest) (int, error) {
	line := req.commandLine()
	if strings.TrimSpace(line) == "" {
		return -1, errors.New("agent exec: empty command")
	}
	if len(line) > MaxCommandLine {
		return -1, fmt.Errorf("agent exec: command line is %d bytes, at most %d (pass large data on stdin)", len(line), MaxCommandLine)
	}
	return c.run(ctx, req, line, false)
}

// Shell runs the user's login shell (req.Cmd and req.CmdLine are
// ignored); usually with TTY set.
func (c *Client) Shell(ctx context.Context, req ExecRequest) (int, error) {
	return c.run(ctx, req, "", true)
}

func (c *Client) run(ctx context.Context, req ExecRequest, line string, shell bool) (int, error) {
	what := "exec"
	if shell {
		what = "shell"
	}
	s, err := c.ssh.NewSession()
	if err != nil {
		return -1, fmt.Errorf("agent %s: new session: %w", what, err)
	}
	defer s.Close()
	env := req.Env
	if req.Dir != "" {
		env = append(env[:len(env):len(env)], EnvWorkdir+"="+req.Dir)
	}
	if req.Keep {
		env = append(env[:len(env):len(env)], EnvKeep+"=1")
	}
	if req.Session != "" {
		env = append(env[:len(env):len(env)], EnvSession+"="+req.Session)
	}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return -1, fmt.Errorf("agent %s: bad environment entry %q", what, kv)
		}
		if err := s.Setenv(k, v); err != nil {
			return -1, fmt.Errorf("agent %s: setenv %s: %w", what, k, err)
		}
	}
	s.Stdout = req.Stdout
	s.Stderr = req.Stderr
	if req.Stdin != nil {
		w, err := s.StdinPipe()
		if err != nil {
			return -1, fmt.Errorf("agent %s: %w", what, err)
		}
		// Not s.Stdin: Wait would wait for Stdin to end.
		go func() {
			io.Copy(w, req.Stdin)
			w.Close()
		}()
	}
	if req.TTY {
		term, rows, cols := req.Term, req.Rows, req.Cols
		if term == "" {
			term = "xterm-256color"
		}
		if rows <= 0 {
			rows = 24
		}
		if cols <= 0 {
			cols = 80
		}
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := s.RequestPty(term, rows, cols, modes); err != nil {
			return -1, fmt.Errorf("agent %s: pty: %w", what, err)
		}
	}
	if shell {
		err = s.Shell()
	} else {
		err = s.Start(line)
	}
	if err != nil {
		return -1, fmt.Errorf("agent %s: start: %w", what, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	resize := req.Resize
	for {
		select {
		case ws, ok := <-resize:
			if !ok {
				resize = nil
				continue
			}
			s.WindowChange(ws.Rows, ws.Cols)
		case err := <-done:
			return exitStatus(what, err)
		case <-ctx.Done():
			s.Signal(ssh.SIGKILL)
			s.Close()
			return -1, fmt.Errorf("agent %s: %w", what, ctx.Err())
		case <-c.done:
			// The session has its status already, or learns it is lost.
			select {
			case err := <-done:
				return exitStatus(what, err)
			case <-time.After(time.Second):
				return -1, fmt.Errorf("agent %s: connection lost", what)
			}
		}
	}
}

func exitStatus(what string, err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus(), nil
	}
	var me *ssh.ExitMissingError
	if errors.As(err, &me) {
		return -1, fmt.Errorf("agent %s: session ended without an exit status (connection lost?)", what)
	}
	return -1, fmt.Errorf("agent %s: %w", what, err)
}

// QuoteCommand joins argv into a POSIX shell command line that runs it
// as given.
func QuoteCommand(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = quoteWord(a)
	}
	return strings.Join(q, " ")
}

func quoteWord(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:,+@%", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
