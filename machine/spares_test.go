package machine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/storage"
)

// spare is the path of vm's checkpoint id's spare disk, "" when there is
// none (its name carries the checkpoint's seal).
func (e *env) spare(vm, id string) string {
	dir, _ := e.vol.Path(storage.Path("spares"))
	matches, _ := filepath.Glob(filepath.Join(dir, vm+"@"+id+"-*"))
	for _, m := range matches {
		if !storage.IsCloneTemp(filepath.Base(m)) {
			return m
		}
	}
	return ""
}

// TestCheckpointSpareGoesWithIt: a checkpoint's spare disk is named by
// the checkpoint's seal, and deleting the checkpoint, even while a
// restore's spare of it is still being cloned, leaves none behind; a
// later checkpoint never finds one.
func TestCheckpointSpareGoesWithIt(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("s")
	for round := 0; round < 3; round++ {
		cp, err := e.m.Checkpoint(ctx, "s", machine.CheckpointOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.Restore(ctx, "s", cp.ID, machine.RestoreOptions{NoSave: true}, nil); err != nil {
			t.Fatal(err)
		}
		if round > 0 { // round 0 deletes while the spare may still be cloned
			testutil.WaitForWithin(t, testTimeout, "the restore's spare is made", func() bool { return e.spare("s", cp.ID) != "" })
		}
		if err := e.m.DeleteCheckpoint(ctx, "s", cp.ID); err != nil {
			t.Fatal(err)
		}
		if sp := e.spare("s", cp.ID); sp != "" {
			t.Fatalf("the spare of deleted %s is left: %s", cp.ID, sp)
		}
	}
	dir, _ := e.vol.Path(storage.Path("spares"))
	ents, _ := os.ReadDir(dir)
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), "s@") {
			t.Errorf("a spare outlived its checkpoint: %s", ent.Name())
		}
	}
}
