package machine_test

import (
	"errors"
	"testing"

	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// TestOwnerCheckedUnderLock: an operation acting for a user finds only
// that user's VMs, by the record read under the VM's lock (where a name
// cannot change hands): another user's VM of the same name is not found
// and is left as it was; the name's owner, and an admin, reach it.
func TestOwnerCheckedUnderLock(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, machine.CreateOptions{Name: "box", Owner: "bob", MemoryBytes: 128 << 20, DiskBytes: imageSize, Cold: true}, nil); err != nil {
		t.Fatal(err)
	}
	alice := machine.AsOwner(ctx, "alice")
	for what, op := range map[string]func() error{
		"sleep":      func() error { return e.m.Sleep(alice, "box", false) },
		"checkpoint": func() error { _, err := e.m.Checkpoint(alice, "box", machine.CheckpointOptions{}, nil); return err },
		"remove":     func() error { return e.m.Remove(alice, "box", true) },
		"fork":       func() error { _, err := e.m.Fork(alice, "box", "", "copy", nil); return err },
	} {
		if err := op(); !errors.Is(err, machine.ErrNotFound) {
			t.Errorf("alice: %s bob's box: %v; want not found", what, err)
		}
	}
	vm := e.wantState("box", registry.StateRunning)
	if vm.Owner != "bob" {
		t.Fatalf("box: owner %q", vm.Owner)
	}
	if _, err := e.m.Record(ctx, "copy"); !errors.Is(err, machine.ErrNotFound) {
		t.Errorf("alice's refused fork left a vm: %v", err)
	}
	if cps, _, err := e.m.Checkpoints(ctx, "box"); err != nil || len(cps) != 0 {
		t.Fatalf("bob's checkpoints after alice's tries: %+v %v", cps, err)
	}
	if err := e.m.Sleep(machine.AsOwner(ctx, "bob"), "box", false); err != nil {
		t.Fatalf("bob sleeps his box: %v", err)
	}
	if err := e.m.Wake(machine.AsOwner(ctx, ""), "box"); err != nil {
		t.Fatalf("an admin wakes bob's box: %v", err)
	}
}
