//go:build linux

package guest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestReaper runs in a child process made a subreaper (as init is), so
// that orphans come to it: they must be reaped, and the exit statuses of
// the processes the agent waits for itself must not be stolen.
func TestReaper(t *testing.T) {
	if os.Getenv("DEN_REAPER_CHILD") == "1" {
		reaperChild(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestReaper$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "DEN_REAPER_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reaper child: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "SKIP") {
		t.Skipf("reaper child skipped:\n%s", out)
	}
}

func reaperChild(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	r := NewReaper(testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	for i := 0; i < 30; i++ {
		// The shell exits at once, leaving an orphan behind.
		cmd := exec.Command("/bin/sh", "-c", "sleep 0.05 & exit 3")
		if err := r.Start(cmd, cmd.Start); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		r.Forget(cmd.Process.Pid)
		if code := cmd.ProcessState.ExitCode(); code != 3 {
			t.Fatalf("run %d: exit status %d, want 3 (stolen by the reaper?)", i, code)
		}
	}
	testutil.WaitForWithin(t, 10*time.Second, "orphans reaped", func() bool {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		return err == unix.ECHILD
	})
}
