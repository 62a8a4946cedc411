package fence

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/vmm"
)

// startVMM starts a real process recorded in a run dir under runs, as a
// VMM is.
func startVMM(t *testing.T, runs, name string) *vmm.Process {
	t.Helper()
	rd := vmm.RunDir(filepath.Join(runs, name))
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := vmm.StartProcess(vmm.ProcessSpec{Binary: "/bin/sleep", Args: []string{"600"}, Log: rd.Log(), PIDFile: rd.PIDFile(), Dir: rd.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// TestGuard: the guard leaves VMMs alone while the deadline is ahead,
// kills every one (a VMM started later too) once it has passed, and exits
// when the deadline is lifted. A second guard of the same state dir does
// not start.
func TestGuard(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "run")
	g := &Guard{File: filepath.Join(dir, "fence.json"), Lock: filepath.Join(dir, "fence.lock"), Runs: runs,
		Every: 10 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a := startVMM(t, runs, "a")
	if err := Push(g.File, "host-a", Now()+int64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	if !poll.Until(30*time.Second, func() bool { return Running(g.Lock) }) {
		t.Fatal("the guard did not take its lock")
	}
	if err := (&Guard{File: g.File, Lock: g.Lock, Runs: runs, Log: g.Log}).Run(ctx); err != ErrRunning {
		t.Fatalf("a second guard: %v, want %v", err, ErrRunning)
	}
	// A deadline ahead: the guard's checks (every 10 ms) leave the VMM
	// alone. What is tested is that nothing happens for a while, so the
	// wait is a time, not a condition.
	if passed, ok, err := Passed(g.File); passed || !ok || err != nil {
		t.Fatalf("deadline an hour ahead: passed %v, ok %v, %v", passed, ok, err)
	}
	if poll.Until(200*time.Millisecond, func() bool { return !a.Alive() }) {
		t.Fatal("the guard killed a VMM before its deadline")
	}
	if err := Push(g.File, "host-a", Now()-1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the guard did not kill the VMM once the deadline passed")
	}
	b := startVMM(t, runs, "b")
	select {
	case <-b.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the guard did not kill a VMM started after the deadline passed")
	}
	if err := Lift(g.File); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the guard did not exit when the deadline was lifted")
	}
}

// TestPassedOtherBoot: a deadline of another boot has passed, and one
// that cannot be read protects nothing.
func TestPassedOtherBoot(t *testing.T) {
	f := filepath.Join(t.TempDir(), "fence.json")
	if _, ok, err := Passed(f); ok || err != nil {
		t.Fatalf("no deadline: ok %v, %v", ok, err)
	}
	if err := os.WriteFile(f, []byte(`{"host":"h","boot_id":"another-boot","at_boottime_ns":9223372036854775807}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if passed, ok, err := Passed(f); !passed || !ok || err != nil {
		t.Fatalf("another boot's deadline: passed %v, ok %v, %v", passed, ok, err)
	}
	if err := os.WriteFile(f, []byte(`{garbage`), 0o600); err != nil {
		t.Fatal(err)
	}
	if passed, ok, _ := Passed(f); !passed || !ok {
		t.Fatalf("an unreadable deadline: passed %v, ok %v", passed, ok)
	}
}
