package vmm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/cgroup"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/testutil"
)

func TestMain(m *testing.M) {
	RunShim() // this test binary is the shim of the confined starts
	os.Exit(m.Run())
}

// procField is a field of /proc/PID/status ("Uid", "NoNewPrivs").
func procField(t *testing.T, pid int, field string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// startConfined starts a sleeper confined by c and checks that it runs
// as nobody, in the group, from the start.
func startConfined(t *testing.T, c Confine, nnp bool) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rd := RunDir(dir)
	p, err := StartProcess(ProcessSpec{Binary: "/bin/sleep", Args: []string{"60"}, Log: rd.Log(), PIDFile: rd.PIDFile(), Dir: dir, Confine: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(time.Second) })
	// The shim execs: wait for the sleeper to be the process.
	if !poll.Until(5*time.Second, func() bool { return procField(t, p.PID(), "Name") == "sleep" }) {
		t.Fatalf("process %d is %q, not sleep", p.PID(), procField(t, p.PID(), "Name"))
	}
	pids, err := c.Cgroup.Pids()
	if err != nil || len(pids) != 1 || pids[0] != p.PID() {
		t.Fatalf("group holds %v (%v), want [%d]", pids, err, p.PID())
	}
	want := fmt.Sprintf("%d %d %d %d", c.User.UID, c.User.UID, c.User.UID, c.User.UID)
	if got := procField(t, p.PID(), "Uid"); got != want {
		t.Errorf("Uid %q, want %q", got, want)
	}
	if got := procField(t, p.PID(), "Groups"); got != "" {
		t.Errorf("supplementary groups %q, want none", got)
	}
	if nnp {
		if got := procField(t, p.PID(), "NoNewPrivs"); got != "1" {
			t.Errorf("NoNewPrivs %q, want 1", got)
		}
	}
	// Stop through an adopted handle: its pidfd.
	a, err := AdoptProcess(rd.PIDFile())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("the child's exit was not noticed")
	}
	if err := c.Cgroup.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func nobody(t *testing.T) *User {
	u, err := LookupUser("nobody")
	if err != nil {
		t.Skip(err)
	}
	return u
}

func TestStartConfinedV1(t *testing.T) {
	testutil.NeedRoot(t, "confinement")
	if _, err := os.Stat(filepath.Join(cgroup.Root, "memory", "memory.limit_in_bytes")); err != nil {
		t.Skip("no cgroup v1 memory controller here")
	}
	g, err := cgroup.NewV1(cgroup.Root).Create(fmt.Sprintf("vmmtest-%d", os.Getpid()), cgroup.Limits{MemoryMax: 64 << 20, PidsMax: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove(context.Background()) })
	startConfined(t, Confine{User: nobody(t), Cgroup: g}, true)
}

func TestStartConfinedV2(t *testing.T) {
	testutil.NeedRoot(t, "confinement")
	root := filepath.Join(cgroup.Root, "unified")
	if _, err := os.Stat(filepath.Join(cgroup.Root, "cgroup.controllers")); err == nil {
		root = cgroup.Root
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v2 hierarchy here")
	}
	g, err := cgroup.NewV2(root).Create(fmt.Sprintf("vmmtest-%d", os.Getpid()), cgroup.Limits{PidsMax: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove(context.Background()) })
	startConfined(t, Confine{User: nobody(t), Cgroup: g}, false)
}
