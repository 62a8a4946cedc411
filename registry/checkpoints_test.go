package registry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/validate"
)

// addCP records checkpoint seq of vm with parent, as den takes one: at
// the sequence number NextCheckpointSeq gives.
func addCP(t *testing.T, db *DB, vm, parent string) Checkpoint {
	t.Helper()
	ctx := context.Background()
	seq, err := db.NextCheckpointSeq(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}
	c := Checkpoint{VM: vm, ID: checkpoint.ID(seq), Seq: seq, Parent: parent, Kind: checkpoint.KindMemoryDisk, CreatedAt: time.Now()}
	if err := db.AddCheckpoint(ctx, c); err != nil {
		t.Fatalf("add %s of %s: %v", c.ID, vm, err)
	}
	return c
}

func newVM(t *testing.T, db *DB, name string) {
	t.Helper()
	now := time.Now().UTC()
	if err := db.CreateVM(context.Background(), VM{Name: name, Owner: "a", Image: "minimal", CPUs: 1, State: StateRunning, CreatedAt: now, LastActive: now}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointIDsNeverReused: deleting a VM's newest checkpoint, or
// the VM with all its checkpoints, does not give its id out again; a
// checkpoint is never recorded under an id handed out before, nor as its
// own parent.
func TestCheckpointIDsNeverReused(t *testing.T) { eachBackend(t, testCheckpointIDsNeverReused) }

func testCheckpointIDsNeverReused(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	newVM(t, db, "box")
	c1 := addCP(t, db, "box", "")
	c2 := addCP(t, db, "box", c1.ID)
	if c1.ID != "cp-1" || c2.ID != "cp-2" {
		t.Fatalf("ids %s, %s", c1.ID, c2.ID)
	}
	if err := db.DeleteCheckpoint(ctx, "box", c2.ID); err != nil {
		t.Fatal(err)
	}
	if c3 := addCP(t, db, "box", c1.ID); c3.ID != "cp-3" {
		t.Fatalf("after deleting the newest checkpoint cp-2 the next is %s, want cp-3", c3.ID)
	}
	// An id handed out before is refused, whatever the caller says.
	c2.Parent = c1.ID
	if err := db.AddCheckpoint(ctx, c2); !errors.Is(err, ErrExists) {
		t.Fatalf("cp-2 recorded again: %v", err)
	}
	// Nor is a checkpoint its own parent.
	self := Checkpoint{VM: "box", ID: "cp-4", Seq: 4, Parent: "cp-4", Kind: checkpoint.KindMemoryDisk, CreatedAt: time.Now()}
	if err := db.AddCheckpoint(ctx, self); !errors.Is(err, validate.ErrInvalid) {
		t.Fatalf("a checkpoint recorded as its own parent: %v", err)
	}
	// The VM removed (its rows with it) and made again: its name goes on
	// from where it was, across a reopen too.
	if err := db.DeleteCheckpoints(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if db, err = open(); err != nil {
		t.Fatal(err)
	}
	newVM(t, db, "box")
	if c := addCP(t, db, "box", ""); c.ID != "cp-4" {
		t.Fatalf("the first checkpoint of a new vm box is %s, want cp-4 (box had up to cp-3)", c.ID)
	}
	// Another name has its own numbers.
	newVM(t, db, "other")
	if c := addCP(t, db, "other", ""); c.ID != "cp-1" {
		t.Fatalf("first checkpoint of another vm: %s", c.ID)
	}
	cps, err := db.ListCheckpoints(ctx, "box")
	if err != nil || len(cps) != 1 || cps[0].ID != "cp-4" {
		t.Fatalf("box's checkpoints: %+v %v", cps, err)
	}
}

// TestCheckpointSeqMigration: a database made before the per-name
// counter goes on from the highest checkpoint it holds, and keeps going
// after that one is deleted.
func TestCheckpointSeqMigration(t *testing.T) {
	ctx := context.Background()
	path := oldDatabase(t, 7,
		`INSERT INTO checkpoints (vm, id, seq, parent, kind, created_at) VALUES ('box', 'cp-1', 1, '', 'memory+disk', 0)`,
		`INSERT INTO checkpoints (vm, id, seq, parent, kind, created_at) VALUES ('box', 'cp-3', 3, 'cp-1', 'memory+disk', 0)`,
		`INSERT INTO checkpoints (vm, id, seq, parent, kind, created_at) VALUES ('old', 'cp-7', 7, '', 'disk', 0)`,
	)
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.DeleteCheckpoint(ctx, "box", "cp-3"); err != nil {
		t.Fatal(err)
	}
	for vm, want := range map[string]int{"box": 4, "old": 8, "new": 1} {
		if n, err := db.NextCheckpointSeq(ctx, vm); err != nil || n != want {
			t.Fatalf("next checkpoint of %s after the migration: %d %v, want %d", vm, n, err, want)
		}
	}
}
