//go:build linux

package machine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/denhq/den/fence"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// TestNoVMMStartsPastTheFence: once this host's fence deadline has
// passed (a cluster host that lost its lease), no operation starts a
// VMM: a create is rolled back and a sleeping VM stays asleep, with one
// line saying why. Lifted, both work.
func TestNoVMMStartsPastTheFence(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("s")
	if err := e.m.Sleep(ctx, "s", false); err != nil {
		t.Fatal(err)
	}
	if err := fence.Push(e.state.Fence(), "host-a", fence.Now()-1); err != nil {
		t.Fatal(err)
	}
	boots := e.drv.Boots()
	_, err := e.m.Create(ctx, machine.CreateOptions{Name: "n", MemoryBytes: 128 << 20, DiskBytes: imageSize, Cold: true}, nil)
	if err == nil || !errors.Is(err, machine.ErrConflict) || !strings.Contains(err.Error(), "fence deadline") {
		t.Fatalf("create past the fence: %v", err)
	}
	if _, err := e.m.Record(ctx, "n"); !errors.Is(err, machine.ErrNotFound) {
		t.Fatalf("the refused create left a record: %v", err)
	}
	if err := e.m.Wake(ctx, "s"); err == nil || !strings.Contains(err.Error(), "lost its host lease") {
		t.Fatalf("wake past the fence: %v", err)
	}
	e.wantState("s", registry.StateSleeping)
	if e.drv.Boots() != boots {
		t.Fatal("a VMM booted past the fence")
	}
	if err := fence.Lift(e.state.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Wake(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	e.create("n")
}
