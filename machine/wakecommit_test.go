//go:build linux

package machine_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"

	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// failingWakeRegistry is the SQLite registry, with the write that
// commits a wake (sleeping to running) failing once when armed.
type failingWakeRegistry struct {
	registry.Store
	armed atomic.Bool
}

func (r *failingWakeRegistry) UpdateVMIf(ctx context.Context, name string, gen int64, f func(*registry.VM) error) (registry.VM, error) {
	if r.armed.Load() {
		if cur, err := r.Store.GetVM(ctx, name); err == nil && cur.State == registry.StateSleeping {
			next := cur
			if f(&next) == nil && next.State == registry.StateRunning && r.armed.CompareAndSwap(true, false) {
				return registry.VM{}, errors.New("injected: registry write failed")
			}
		}
	}
	return r.Store.UpdateVMIf(ctx, name, gen, f)
}

// TestWakeCommitFailure: when the registry write that commits a wake
// fails, the guest has run (and may have written its disk), so the
// suspend slot's memory no longer matches the disk. The VM must not be
// left recorded as sleeping with that slot for a later wake to restore:
// it is stopped, its slot gone, and the next reach boots it from its
// disk.
func TestWakeCommitFailure(t *testing.T) {
	var db *failingWakeRegistry
	e := newEnvWith(t, func(c *machine.Config) {
		db = &failingWakeRegistry{Store: c.Registry}
		c.Registry = db
	})
	ctx := ctxT(t)
	e.create("w")
	if err := e.m.Sleep(ctx, "w", false); err != nil {
		t.Fatal(err)
	}
	slot, err := e.vol.Path(storage.SuspendDir("w"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(slot); err != nil {
		t.Fatalf("no suspend slot after the sleep: %v", err)
	}
	var restores atomic.Int32
	e.drv.Hook = func(op, rd string) {
		if op == "restore" {
			restores.Add(1)
		}
	}
	db.armed.Store(true)
	if err := e.m.Wake(ctx, "w"); err == nil {
		t.Fatal("a wake whose registry write failed succeeded")
	}
	if db.armed.Load() {
		t.Fatal("the wake never wrote its record")
	}
	if restores.Load() != 1 {
		t.Fatalf("the failed wake restored %d times, want 1 (the guest ran)", restores.Load())
	}
	vm := e.record("w")
	_, serr := os.Stat(slot)
	if vm.State == registry.StateSleeping && serr == nil {
		t.Fatalf("after a wake whose commit failed, w is recorded sleeping (%q) with its old slot: the next wake restores memory older than its disk", vm.Reason)
	}
	if vm.State != registry.StateStopped {
		t.Fatalf("w is %s (%s), want stopped", vm.State, vm.Reason)
	}
	if v := e.drv.VM(e.state.Run("w")); v != nil {
		t.Fatal("a vmm runs for a vm recorded stopped")
	}
	// The next reach boots from the disk; nothing restores the old slot.
	boots := e.drv.Boots()
	if err := e.m.Wake(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if e.drv.Boots() != boots+1 || restores.Load() != 1 {
		t.Fatalf("the next wake booted %d times and restored %d times, want a boot and no restore", e.drv.Boots()-boots, restores.Load()-1)
	}
	e.wantState("w", registry.StateRunning)
}
