package registry

import (
	"errors"
	"testing"
	"time"
)

func TestDiskUsage(t *testing.T) { eachBackend(t, testDiskUsage) }

// testDiskUsage: a figure is kept only for the record as it is, is read
// back by another connection (a host of a cluster, a restart), gives way
// to the next, and goes with its VM.
func testDiskUsage(t *testing.T, open func() (*DB, error)) {
	ctx := t.Context()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UTC().Truncate(time.Millisecond)
	vm := VM{Name: "box", Owner: "alice", Image: "minimal", CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30,
		State: StateSleeping, VMM: "qemu", Accel: "tcg", CreatedAt: now, LastActive: now}
	if err := db.CreateVM(ctx, vm); err != nil {
		t.Fatal(err)
	}
	rec, err := db.GetVM(ctx, "box")
	if err != nil {
		t.Fatal(err)
	}
	fig := DiskUsage{VM: "box", Created: rec.CreatedAt, Generation: rec.Generation, Data: 7 << 20}
	// A figure of an older generation, of another creation, of no VM:
	// none is kept.
	stale := []DiskUsage{
		{VM: "box", Created: rec.CreatedAt, Generation: rec.Generation - 1, Data: 1},
		{VM: "box", Created: rec.CreatedAt.Add(-time.Hour), Generation: rec.Generation, Data: 2},
		{VM: "gone", Created: rec.CreatedAt, Generation: 1, Data: 3},
	}
	if err := db.SetDiskUsage(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got, err := db.DiskUsages(ctx); err != nil || len(got) != 0 {
		t.Fatalf("figures of records that are not: %v %v", got, err)
	}
	if err := db.SetDiskUsage(ctx, []DiskUsage{fig}); err != nil {
		t.Fatal(err)
	}

	other, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	got, err := other.DiskUsages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := got["box"]; len(got) != 1 || g.Data != fig.Data || !g.Holds(rec) {
		t.Fatalf("figures read by another connection: %+v", got)
	}

	// The record changes: the figure no longer holds, and the next one
	// replaces it.
	rec, err = db.UpdateVM(ctx, "box", func(v *VM) error { v.State = StateRunning; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := other.DiskUsages(ctx); got["box"].Holds(rec) {
		t.Fatal("a figure holds across a change of the record")
	}
	next := DiskUsage{VM: "box", Created: rec.CreatedAt, Generation: rec.Generation, Data: 9 << 20}
	if err := other.SetDiskUsage(ctx, []DiskUsage{next}); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.DiskUsages(ctx); got["box"] != next {
		t.Fatalf("after the next figure: %+v, want %+v", got["box"], next)
	}

	if err := db.DeleteVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if got, err := db.DiskUsages(ctx); err != nil || len(got) != 0 {
		t.Fatalf("figures after the vm's removal: %v %v", got, err)
	}
	// A VM made again under the name has no figure of the old one.
	if err := db.CreateVM(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if got, err := db.DiskUsages(ctx); err != nil || len(got) != 0 {
		t.Fatalf("figures of a vm made again: %v %v", got, err)
	}
	if err := db.DeleteVM(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete an unknown vm: %v", err)
	}
}
