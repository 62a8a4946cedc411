//go:build linux

package machine_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// TestWakeBound: a host wakes at most Config.MaxWakes VMs at once; a wake
// beyond the bound waits for a slot, and fails in one line, as busy, when
// none frees within Config.WakeWait, starting no VMM.
func TestWakeBound(t *testing.T) {
	e := newEnvWith(t, func(c *machine.Config) { c.MaxWakes, c.WakeWait = 1, 500*time.Millisecond })
	ctx := ctxT(t)
	for _, name := range []string{"a", "b"} {
		e.create(name)
		if err := e.m.Sleep(ctx, name, false); err != nil {
			t.Fatal(err)
		}
	}
	entered, release := make(chan struct{}), make(chan struct{})
	e.drv.Hook = func(op, rundir string) {
		if op == "restore" && strings.HasSuffix(rundir, "/a") {
			close(entered)
			<-release
		}
	}
	first := make(chan error, 1)
	go func() { first <- e.m.Wake(ctx, "a") }()
	<-entered
	boots := e.drv.Live()
	err := e.m.Wake(ctx, "b")
	if !errors.Is(err, machine.ErrBusy) || !strings.Contains(err.Error(), "waking 1 vms, its bound") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a wake beyond the bound: %v", err)
	}
	if e.drv.Live() != boots {
		t.Fatal("a wake beyond the bound started a VMM")
	}
	e.wantState("b", registry.StateSleeping)
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	e.drv.Hook = nil
	if err := e.m.Wake(ctx, "b"); err != nil {
		t.Fatalf("a wake once the slot was free: %v", err)
	}
	e.wantState("b", registry.StateRunning)
}
