package registry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestVMRecordLifecycle(t *testing.T) { eachBackend(t, testVMRecordLifecycle) }

func testVMRecordLifecycle(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	vm := VM{Name: "box", Owner: "alice", Image: "minimal", CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30,
		State: StateCreating, VMM: "qemu", Accel: "tcg", IdleTimeout: 10 * time.Minute, CreatedAt: now, LastActive: now}
	if err := db.CreateVM(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateVM(ctx, vm); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	if _, err := db.UpdateVM(ctx, "box", func(v *VM) error { v.State = StateRunning; return nil }); err != nil {
		t.Fatal(err)
	}
	// An invalid transition is refused and nothing changes.
	if _, err := db.UpdateVM(ctx, "box", func(v *VM) error { v.State = StateCreating; return nil }); err == nil {
		t.Fatal("running -> creating accepted")
	}
	db.Close()

	// Reopen: the record survived, schema not reapplied.
	db, err = open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, err := db.GetVM(ctx, "box")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.IdleTimeout != 10*time.Minute || !got.CreatedAt.Equal(now) || got.Owner != "alice" {
		t.Fatalf("got %+v", got)
	}
	list, err := db.ListVMs(ctx, "bob")
	if err != nil || len(list) != 0 {
		t.Fatalf("bob's vms: %v %v", list, err)
	}
	if err := db.DeleteVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.GetVM(ctx, "box"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted vm: %v", err)
	}
}
