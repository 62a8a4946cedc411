package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/validate"
)

// TestRefusesInvalid: the registry is the last line of defence: a VM,
// checkpoint or key with a bad name, owner, image, id or an over-long
// string is refused, and nothing is stored.
func TestRefusesInvalid(t *testing.T) { eachBackend(t, testRefusesInvalid) }

func testRefusesInvalid(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UTC().Truncate(time.Millisecond)
	good := VM{Name: "box", Owner: "alice", Image: "minimal", CPUs: 1, State: StateRunning, CreatedAt: now, LastActive: now}
	long := strings.Repeat("a", 300)
	for _, bad := range []func(*VM){
		func(v *VM) { v.Name = "../x" },
		func(v *VM) { v.Name = "a\x00b" },
		func(v *VM) { v.Name = long },
		func(v *VM) { v.Owner = "../x" },
		func(v *VM) { v.Owner = "a\x00b" },
		func(v *VM) { v.Owner = long },
		func(v *VM) { v.Owner = "" },
		func(v *VM) { v.Image = "../x" },
		func(v *VM) { v.Image = "a\x00" },
		func(v *VM) { v.Image = long },
	} {
		vm := good
		bad(&vm)
		if err := db.CreateVM(ctx, vm); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("create %q owner %q image %q: %v, want invalid", vm.Name, vm.Owner, vm.Image, err)
		}
	}
	if vms, err := db.ListVMs(ctx, ""); err != nil || len(vms) != 0 {
		t.Fatalf("vms stored: %v %v", vms, err)
	}
	if err := db.CreateVM(ctx, good); err != nil {
		t.Fatal(err)
	}
	if _, err := db.UpdateVM(ctx, "box", func(v *VM) error { v.Owner = "../x"; return nil }); !errors.Is(err, validate.ErrInvalid) {
		t.Errorf("update to owner ../x: %v", err)
	}
	if vm, _ := db.GetVM(ctx, "box"); vm.Owner != "alice" || vm.Generation != 1 {
		t.Errorf("after a refused update: %+v", vm)
	}

	cp := Checkpoint{VM: "box", ID: "cp-1", Seq: 1, Kind: "disk-only", CreatedAt: now}
	for _, bad := range []func(*Checkpoint){
		func(c *Checkpoint) { c.ID = "../x" },
		func(c *Checkpoint) { c.ID = "cp-1\x00" },
		func(c *Checkpoint) { c.ID = "cp-" + strings.Repeat("1", 297) },
		func(c *Checkpoint) { c.VM = "../x" },
		func(c *Checkpoint) { c.Parent = "../x" },
		func(c *Checkpoint) { c.Comment = strings.Repeat("c", 1<<20) },
		func(c *Checkpoint) { c.Comment = "a\x00b" },
	} {
		c := cp
		bad(&c)
		if err := db.AddCheckpoint(ctx, c); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("add checkpoint %q of %q parent %q comment of %d bytes: %v, want invalid", c.ID, c.VM, c.Parent, len(c.Comment), err)
		}
	}
	if cps, err := db.ListCheckpoints(ctx, "box"); err != nil || len(cps) != 0 {
		t.Errorf("checkpoints stored: %v %v", cps, err)
	}

	key := Key{Fingerprint: "SHA256:x", User: "alice", Name: "laptop", PublicKey: "ssh-ed25519 AAAA"}
	for _, bad := range []func(*Key){
		func(k *Key) { k.User = "../x" },
		func(k *Key) { k.User = "a\x00b" },
		func(k *Key) { k.User = long },
		func(k *Key) { k.Name = long },
		func(k *Key) { k.Name = "a\x00b" },
		func(k *Key) { k.PublicKey = strings.Repeat("k", 1<<20) },
	} {
		k := key
		bad(&k)
		if err := db.AddKey(ctx, k); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("add key of %q named %q: %v, want invalid", k.User, k.Name, err)
		}
	}
	if keys, err := db.ListKeys(ctx, ""); err != nil || len(keys) != 0 {
		t.Errorf("keys stored: %v %v", keys, err)
	}
}

// TestTouchVM: last activity is raised, never lowered, with no new
// generation (an operation's compare-and-set stays good), and an update
// keeps it.
func TestTouchVM(t *testing.T) { eachBackend(t, testTouchVM) }

func testTouchVM(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	if err := db.CreateVM(ctx, VM{Name: "box", Owner: "alice", Image: "minimal", CPUs: 1, State: StateRunning, CreatedAt: t0, LastActive: t0}); err != nil {
		t.Fatal(err)
	}
	read, _ := db.GetVM(ctx, "box")
	t1 := t0.Add(time.Minute)
	if err := db.TouchVM(ctx, "box", t1); err != nil {
		t.Fatal(err)
	}
	if err := db.TouchVM(ctx, "box", t0); err != nil { // older: ignored
		t.Fatal(err)
	}
	vm, _ := db.GetVM(ctx, "box")
	if !vm.LastActive.Equal(t1) || vm.Generation != read.Generation {
		t.Errorf("after touch: last active %s gen %d, want %s gen %d", vm.LastActive, vm.Generation, t1, read.Generation)
	}
	// An operation that read the record before the touch still writes.
	vm, err = db.UpdateVMIf(ctx, "box", read.Generation, func(v *VM) error { v.Reason = "x"; return nil })
	if err != nil {
		t.Fatalf("compare-and-set after a touch: %v", err)
	}
	if got, _ := db.GetVM(ctx, "box"); !got.LastActive.Equal(t1) || !vm.LastActive.Equal(t1) {
		t.Errorf("an update lowered last active: %s (returned %s), want %s", got.LastActive, vm.LastActive, t1)
	}
	if err := db.TouchVM(ctx, "ghost", t1); !errors.Is(err, ErrNotFound) {
		t.Errorf("touch ghost: %v", err)
	}
}
