//go:build linux

package machine_test

import (
	"os"
	"testing"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// diskMark is how long a marker writeDisk writes at the start of a VM's
// disk is.
const diskMark = 16

// writeDisk writes mark (diskMark bytes at most) at the start of name's
// disk on the volume, as a guest's synced write would.
func (e *env) writeDisk(name, mark string) {
	e.t.Helper()
	p, err := e.vol.Path(storage.VMDisk(name))
	if err != nil {
		e.t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, diskMark)
	copy(b, mark)
	if _, err := f.WriteAt(b, 0); err != nil {
		e.t.Fatal(err)
	}
}

// readDisk is the marker at the start of name's disk.
func (e *env) readDisk(name string) string {
	e.t.Helper()
	p, err := e.vol.Path(storage.VMDisk(name))
	if err != nil {
		e.t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, diskMark)
	if _, err := f.ReadAt(b, 0); err != nil {
		e.t.Fatal(err)
	}
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// checkpointOf is name's checkpoint id as listed.
func (e *env) checkpointOf(name, id string) registry.Checkpoint {
	e.t.Helper()
	cps, _, err := e.m.Checkpoints(ctxT(e.t), name)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, cp := range cps {
		if cp.ID == id {
			return cp
		}
	}
	e.t.Fatalf("%s has no checkpoint %s: %+v", name, id, cps)
	return registry.Checkpoint{}
}

// TestRestoreSavesStoppedAndSleeping: unless told not to, a restore
// saves the state it replaces whatever the VM's state: a VM whose VMM
// died (stopped, no memory left) gets a disk-only checkpoint of its
// disk, a sleeping one a memory+disk checkpoint of its suspend slot; and
// restoring that checkpoint brings the state back.
func TestRestoreSavesStoppedAndSleeping(t *testing.T) {
	e := newEnv(t)
	// start makes a VM with checkpoint cp-1 of marker "at cp-1" on its
	// disk, and returns its memory there.
	start := func(name string) string {
		e.create(name)
		e.writeDisk(name, "at cp-1")
		if _, err := e.m.Checkpoint(ctxT(t), name, machine.CheckpointOptions{}, nil); err != nil {
			t.Fatal(err)
		}
		return e.memory(name)
	}
	kill := func(t *testing.T, name string) {
		e.drv.VM(e.state.Run(name)).Kill()
		testutil.WaitForWithin(t, testTimeout, name+" recorded stopped", func() bool { return e.record(name).State == registry.StateStopped })
	}

	t.Run("stopped", func(t *testing.T) {
		ctx := ctxT(t)
		start("s")
		e.writeDisk("s", "after cp-1")
		kill(t, "s")
		saved, err := e.m.Restore(ctx, "s", "cp-1", machine.RestoreOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.readDisk("s"); got != "at cp-1" {
			t.Fatalf("disk after the restore to cp-1: %q", got)
		}
		if saved == "" {
			t.Fatal("restoring a stopped vm saved nothing: its disk written since cp-1 is lost")
		}
		if cp := e.checkpointOf("s", saved); cp.Kind != checkpoint.KindDiskOnly || cp.Parent != "cp-1" {
			t.Fatalf("the saved state %s: %+v, want a disk-only child of cp-1", saved, cp)
		}
		if _, err := e.m.Restore(ctx, "s", saved, machine.RestoreOptions{NoSave: true}, nil); err != nil {
			t.Fatal(err)
		}
		if got := e.readDisk("s"); got != "after cp-1" {
			t.Fatalf("disk after the restore to the saved %s: %q", saved, got)
		}
		e.wantState("s", registry.StateRunning)
	})

	t.Run("sleeping", func(t *testing.T) {
		ctx := ctxT(t)
		memCP1 := start("z")
		// A boot from the disk gives the VM memory of its own.
		kill(t, "z")
		if err := e.m.Wake(ctx, "z"); err != nil {
			t.Fatal(err)
		}
		mem := e.memory("z")
		if mem == "" || mem == memCP1 {
			t.Fatalf("memory %q, at cp-1 %q", mem, memCP1)
		}
		e.writeDisk("z", "asleep")
		if err := e.m.Sleep(ctx, "z", false); err != nil {
			t.Fatal(err)
		}
		saved, err := e.m.Restore(ctx, "z", "cp-1", machine.RestoreOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if saved == "" {
			t.Fatal("restoring a sleeping vm saved nothing")
		}
		if got := e.memory("z"); got != memCP1 || e.readDisk("z") != "at cp-1" {
			t.Fatalf("after the restore to cp-1: memory %q (want %q), disk %q", got, memCP1, e.readDisk("z"))
		}
		if cp := e.checkpointOf("z", saved); cp.Kind != checkpoint.KindMemoryDisk {
			t.Fatalf("the saved state %s: %+v, want memory+disk", saved, cp)
		}
		if _, err := e.m.Restore(ctx, "z", saved, machine.RestoreOptions{NoSave: true}, nil); err != nil {
			t.Fatal(err)
		}
		if got := e.memory("z"); got != mem || e.readDisk("z") != "asleep" {
			t.Fatalf("after the restore to the saved %s: memory %q (want %q), disk %q", saved, got, mem, e.readDisk("z"))
		}
	})
}
