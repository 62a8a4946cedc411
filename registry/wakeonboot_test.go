package registry

import (
	"context"
	"testing"
	"time"
)

// TestWakeOnBootRule: the mark survives the sleep it was set for and
// writes that keep the state, and any other state change clears it.
func TestWakeOnBootRule(t *testing.T) { eachBackend(t, testWakeOnBootRule) }

func testWakeOnBootRule(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UTC()
	if err := db.CreateVM(ctx, VM{Name: "box", Owner: "a", Image: "minimal", CPUs: 1, State: StateRunning, CreatedAt: now, LastActive: now}); err != nil {
		t.Fatal(err)
	}
	set := func(f func(*VM)) VM {
		t.Helper()
		vm, err := db.UpdateVM(ctx, "box", func(v *VM) error { f(v); return nil })
		if err != nil {
			t.Fatal(err)
		}
		got, err := db.GetVM(ctx, "box")
		if err != nil || got.WakeOnBoot != vm.WakeOnBoot {
			t.Fatalf("read back %+v (%v), wrote %+v", got, err, vm)
		}
		return vm
	}
	if vm := set(func(v *VM) { v.WakeOnBoot = true }); !vm.WakeOnBoot {
		t.Fatal("mark on a running vm not kept")
	}
	if vm := set(func(v *VM) { v.State = StateSleeping }); !vm.WakeOnBoot {
		t.Fatal("mark lost by the sleep it was set for")
	}
	if vm := set(func(v *VM) { v.Reason = "asleep for a host shutdown" }); !vm.WakeOnBoot {
		t.Fatal("mark lost by a write that keeps the state")
	}
	if vm := set(func(v *VM) { v.State = StateRunning }); vm.WakeOnBoot {
		t.Fatal("mark kept by the wake")
	}
	set(func(v *VM) { v.WakeOnBoot = true })
	if vm := set(func(v *VM) { v.State = StateStopped }); vm.WakeOnBoot {
		t.Fatal("mark kept on a stopped vm")
	}
}

// TestWakeOnBootMigration: a database made before the column existed
// opens, keeps its records, and reads them unmarked.
func TestWakeOnBootMigration(t *testing.T) {
	ctx := context.Background()
	path := oldDatabase(t, 4,
		`INSERT INTO vms (name, owner, image, cpus, memory_bytes, disk_bytes, state, created_at, last_active, generation)
		VALUES ('old', 'a', 'minimal', 1, 1, 1, 'sleeping', 0, 0, 7)`,
	)
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	vm, err := db.GetVM(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if vm.State != StateSleeping || vm.Generation != 7 || vm.WakeOnBoot {
		t.Fatalf("old record after the migration: %+v", vm)
	}
}
