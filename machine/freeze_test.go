package machine_test

import (
	"errors"
	"testing"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// TestFrozenCloneOutlastingTheFreeze: a disk-only checkpoint whose disk
// clone outlasted the guest's freeze (the agent thaws on its own after
// it) is refused, not recorded as consistent; the VM runs on.
func TestFrozenCloneOutlastingTheFreeze(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	restore := machine.SetFreezeWindow(time.Nanosecond)
	_, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{DiskOnly: true}, nil)
	restore()
	if !errors.Is(err, checkpoint.ErrThawedEarly) {
		t.Fatalf("a disk-only checkpoint outlasting the freeze: %v; want %v", err, checkpoint.ErrThawedEarly)
	}
	if cps, _, err := e.m.Checkpoints(ctx, "a"); err != nil || len(cps) != 0 {
		t.Fatalf("checkpoints after the refusal: %+v %v", cps, err)
	}
	e.wantState("a", registry.StateRunning)
	cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{DiskOnly: true}, nil)
	if err != nil || cp.ID == "" {
		t.Fatalf("a disk-only checkpoint within the freeze: %+v %v", cp, err)
	}
}
