//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/testutil"
)

func TestExecExitCodes(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	for _, tc := range []struct {
		line string
		want int
	}{
		{"true", 0},
		{"exit 3", 3},
		{"exit 255", 255},
		{"kill -TERM $$", 128 + 15},
		{"kill -HUP $$", 128 + 1},
		{"kill -VTALRM $$", 128 + 26}, // not an RFC 4254 signal: sent as 128+n
		{"no-such-command-den", 127},
	} {
		code, _, _ := run(t, c, agent.ExecRequest{CmdLine: tc.line})
		if code != tc.want {
			t.Errorf("%q: exit %d, want %d", tc.line, code, tc.want)
		}
	}
}

func TestExecStreamsEnvDir(t *testing.T) {
	h := newHarness(t)
	c := h.dial()

	code, out, errOut := run(t, c, agent.ExecRequest{
		CmdLine: `cat; echo "to stderr" >&2`,
		Stdin:   strings.NewReader("hello from stdin\n"),
	})
	if code != 0 || out != "hello from stdin\n" || errOut != "to stderr\n" {
		t.Errorf("stdin/stderr: code %d out %q err %q", code, out, errOut)
	}

	_, out, _ = run(t, c, agent.ExecRequest{
		CmdLine: `echo "$FOO|$HOME|$PATH|${DEN_WORKDIR-unset}"`,
		Env:     []string{"FOO=bar baz", "PATH=/custom:/usr/bin:/bin"},
	})
	if want := "bar baz|" + h.home + "|/custom:/usr/bin:/bin|unset\n"; out != want {
		t.Errorf("env: got %q, want %q", out, want)
	}

	_, out, _ = run(t, c, agent.ExecRequest{CmdLine: "pwd"})
	if out != h.home+"\n" {
		t.Errorf("default dir: %q, want home %q", out, h.home)
	}
	dir := t.TempDir()
	_, out, _ = run(t, c, agent.ExecRequest{CmdLine: "pwd", Dir: dir})
	if out != dir+"\n" {
		t.Errorf("dir: %q, want %q", out, dir)
	}
	writeFile(t, filepath.Join(h.home, "sub", "f"), "x")
	_, out, _ = run(t, c, agent.ExecRequest{CmdLine: "pwd", Dir: "sub"})
	if out != filepath.Join(h.home, "sub")+"\n" {
		t.Errorf("relative dir: %q", out)
	}
	code, _, errOut = run(t, c, agent.ExecRequest{CmdLine: "pwd", Dir: "/no/such/dir"})
	if code != agent.ExitSetupFailed || !strings.Contains(errOut, "working directory") {
		t.Errorf("missing dir: code %d stderr %q", code, errOut)
	}

	// argv goes through the guest shell untouched.
	argv := []string{"printf", "%s|", "a b", "it's", "$HOME", "", "*", "x=y", `back\slash`, "new\nline"}
	_, out, _ = run(t, c, agent.ExecRequest{Cmd: argv})
	if want := strings.Join(argv[2:], "|") + "|"; out != want {
		t.Errorf("argv: got %q, want %q", out, want)
	}

	// Large output arrives whole.
	code, out, _ = run(t, c, agent.ExecRequest{CmdLine: "head -c 3000000 /dev/zero"})
	if code != 0 || len(out) != 3000000 {
		t.Errorf("large output: code %d, %d bytes", code, len(out))
	}
}

func TestExecBackgroundChildDoesNotHang(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	start := time.Now()
	pidFile := filepath.Join(t.TempDir(), "pid")
	code, out, _ := run(t, c, agent.ExecRequest{CmdLine: "sleep 30 & echo $! > " + pidFile + "; echo started"})
	if code != 0 || out != "started\n" {
		t.Errorf("code %d out %q", code, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("exec waited %v for a background child", d)
	}
	if data, err := os.ReadFile(pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestExecCancelKills(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Exec(ctx, agent.ExecRequest{CmdLine: "sleep 20"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want deadline exceeded", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("cancel did not return promptly")
	}
	testutil.WaitForWithin(t, 10*time.Second, "session to end", func() bool { return h.srv.Sessions() == 0 })
}

func TestPTYSessionResize(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var out testutil.Buffer
	resize := make(chan agent.WindowSize, 1)
	done := make(chan struct{})
	var code int
	var err error
	go func() {
		defer close(done)
		code, err = c.Exec(testCtx(t), agent.ExecRequest{
			CmdLine: `echo "term=$TERM"; tty; stty size; while read x; do [ "$x" = q ] && exit 7; stty size; done`,
			TTY:     true, Term: "xterm-den", Rows: 30, Cols: 100,
			Stdin: stdinR, Stdout: &out, Resize: resize,
		})
	}()
	testutil.WaitForWithin(t, 10*time.Second, "first size", func() bool { return strings.Contains(out.String(), "30 100") })
	resize <- agent.WindowSize{Rows: 40, Cols: 120}
	testutil.WaitForWithin(t, 10*time.Second, "size after resize", func() bool {
		stdinW.Write([]byte("\n"))
		time.Sleep(50 * time.Millisecond)
		return strings.Contains(out.String(), "40 120")
	})
	stdinW.Write([]byte("q\n"))
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("pty session did not end")
	}
	if err != nil || code != 7 {
		t.Fatalf("pty exit: code %d err %v; output %q", code, err, out.String())
	}
	s := out.String()
	if !strings.Contains(s, "term=xterm-den") || !strings.Contains(s, "/dev/pts/") {
		t.Errorf("pty output %q lacks TERM or a pts", s)
	}
}

func TestShellLoginPTY(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	var out testutil.Buffer
	code, err := c.Shell(testCtx(t), agent.ExecRequest{
		TTY: true, Stdin: strings.NewReader("echo shell-$((6*7))\nexit 5\n"), Stdout: &out,
	})
	if err != nil || code != 5 || !strings.Contains(out.String(), "shell-42") {
		t.Fatalf("shell: code %d err %v out %q", code, err, out.String())
	}
}

func TestActivityCountsSessions(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Exec(ctx, agent.ExecRequest{CmdLine: "sleep 20"})
	testutil.WaitForWithin(t, 10*time.Second, "a session", func() bool {
		a, err := c.Activity(testCtx(t))
		return err == nil && a.Sessions == 1
	})
	cancel()
	testutil.WaitForWithin(t, 10*time.Second, "no session", func() bool {
		a, err := c.Activity(testCtx(t))
		return err == nil && a.Sessions == 0
	})
	a, err := c.Activity(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	// Processes may be -1 here: other tasks on a shared test machine can
	// make /proc/PID/stat reads hang (see procCounter).
	if a.CPUs < 1 || a.CPUTotal <= 0 || a.CPUBusy <= 0 || a.Processes == 0 {
		t.Errorf("activity from the host's /proc looks empty: %+v", a)
	}
}

// TestHangupSparesWhatOutlivesTheCommand: a channel that closes after the
// command's own process exited (the client answering the agent's close
// before the agent is done) must not signal the process group: a
// background job the command started is the user's to keep. Before the
// command exits, a hangup does signal the group.
func TestHangupSparesWhatOutlivesTheCommand(t *testing.T) {
	for _, tc := range []struct {
		name       string
		waitFirst  bool
		wantSignal string
	}{
		{"after exit", true, "term\n"},
		{"while running", false, "hup\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			marks, pidFile := filepath.Join(dir, "marks"), filepath.Join(dir, "pid")
			// The background job records which signal reached it first.
			// It writes its pid once its traps are set.
			job := `sh -c 'trap "echo hup >> ` + marks + `; exit" HUP; trap "echo term >> ` + marks + `; exit" TERM; echo $$ > ` + pidFile + `.tmp; mv ` + pidFile + `.tmp ` + pidFile + `; while :; do sleep 0.05; done' &`
			if !tc.waitFirst {
				job += "\nwait"
			}
			cmd := exec.Command("sh", "-c", job)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ss := &session{s: &Server{}, done: make(chan struct{})}
			ss.setProc(&running{pid: cmd.Process.Pid})
			testutil.WaitForWithin(t, 10*time.Second, "the job's pid", func() bool {
				_, err := os.Stat(pidFile)
				return err == nil
			})
			b, _ := os.ReadFile(pidFile)
			jobPID, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Kill(jobPID, syscall.SIGKILL)
			if tc.waitFirst {
				ss.wait(cmd)
			}
			ss.hangup()
			// A SIGHUP sent by the hangup is pending before this TERM
			// and is handled first.
			syscall.Kill(jobPID, syscall.SIGTERM)
			testutil.WaitForWithin(t, 10*time.Second, "the job's mark", func() bool {
				b, err := os.ReadFile(marks)
				return err == nil && len(b) > 0
			})
			if !tc.waitFirst {
				ss.wait(cmd)
			}
			close(ss.done)
			if b, _ := os.ReadFile(marks); !strings.HasPrefix(string(b), tc.wantSignal) {
				t.Errorf("the job saw %q first, want %q", b, tc.wantSignal)
			}
		})
	}
}

// TestKeptCommandOutlivesItsConnection: a command run with Keep runs on
// when its connection ends without a word (as when the VM slept and its
// connections were reset), its output read and dropped, and it stops
// counting as a session; without Keep the hangup ends it.
func TestKeptCommandOutlivesItsConnection(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			h := newHarness(t)
			c := h.dial()
			dir := t.TempDir()
			pidFile, ticks := filepath.Join(dir, "pid"), filepath.Join(dir, "ticks")
			line := "echo $$ > " + pidFile + ".tmp && mv " + pidFile + ".tmp " + pidFile +
				"; i=0; while :; do i=$((i+1)); echo out $i; echo $i > " + ticks + "; sleep 0.02; done"
			go c.Exec(context.Background(), agent.ExecRequest{CmdLine: line, Keep: keep, Stdout: io.Discard})
			testutil.WaitForWithin(t, 10*time.Second, "the command's pid", func() bool {
				_, err := os.Stat(pidFile)
				return err == nil
			})
			b, _ := os.ReadFile(pidFile)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Kill(-pid, syscall.SIGKILL)
			c.Close()
			testutil.WaitForWithin(t, 10*time.Second, "no session", func() bool { return h.srv.Sessions() == 0 })
			if !keep {
				testutil.WaitForWithin(t, 20*time.Second, "the hung-up command to end", func() bool {
					return syscall.Kill(pid, 0) != nil
				})
				return
			}
			tick := func() int {
				b, _ := os.ReadFile(ticks)
				n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return n
			}
			// Well past the hangup grace: it still runs, and writes.
			since := time.Now()
			n0 := tick()
			testutil.WaitForWithin(t, 30*time.Second, "the kept command to write on past the hangup grace", func() bool {
				return time.Since(since) > hangupGrace+time.Second && tick() > n0+50
			})
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("the kept command ended: %v", err)
			}
		})
	}
}
