//go:build linux

package machine_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/machine/machinetest"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// hostDir is a volume path on the host.
func (e *env) hostDir(p storage.Path) string {
	e.t.Helper()
	h, err := e.vol.Path(p)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// waitSealed waits for the background digests of a snapshot directory.
func (e *env) waitSealed(p storage.Path) {
	e.t.Helper()
	testutil.WaitForWithin(e.t, testTimeout, "digests of "+string(p), func() bool {
		return checkpoint.Sealed(e.hostDir(p)) && !e.m.Sealing(p)
	})
}

// TestDamagedCheckpointIsRefused: a checkpoint whose device state, or
// one memory extent, no longer matches its digests is refused by restore
// and fork with a line naming the file and extent, and the VM is left as
// it was; verify names the damage, marks it, and clears the mark once
// the file is whole again.
func TestDamagedCheckpointIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		off        int64
		want       string
	}{
		{"device state", "fake-snapshot.json", 10, `checkpoint cp-1 of "a" is damaged: vmm/fake-snapshot.json extent 0 (offset 0 MiB) does not match its digest`},
		{"memory extent", machinetest.RAMFile, 9<<20 + 1, `checkpoint cp-1 of "a" is damaged: vmm/fake-ram extent 2 (offset 8 MiB) does not match its digest`},
		{"disk", checkpoint.DiskFile, 0, `checkpoint cp-1 of "a" is damaged: disk extent 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := ctxT(t)
			e.create("a")
			cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			dir := checkpoint.Dir("a", cp.ID)
			e.waitSealed(dir)
			if _, err := e.m.VerifyCheckpoint(ctx, "a", cp.ID, nil); err != nil {
				t.Fatalf("intact checkpoint: %v", err)
			}
			path := filepath.Join(e.hostDir(dir), checkpoint.VMMDir, tc.file)
			if tc.file == checkpoint.DiskFile {
				path = filepath.Join(e.hostDir(dir), tc.file)
			}
			testutil.FlipBytes(t, path, tc.off)
			mem, boots := e.memory("a"), e.drv.Boots()
			_, err = e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{}, nil)
			if !errors.Is(err, machine.ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: %v\nwant %q", err, tc.want)
			}
			// Untouched: the same guest runs, and nothing was saved.
			e.wantState("a", registry.StateRunning)
			if e.memory("a") != mem || e.drv.Boots() != boots {
				t.Fatal("the refused restore changed the vm")
			}
			cps, _, err := e.m.Checkpoints(ctx, "a")
			if err != nil || len(cps) != 1 || !strings.Contains(cps[0].Damaged, tc.want) {
				t.Fatalf("checkpoints after the refusal: %+v %v", cps, err)
			}
			if _, err := e.m.Fork(ctx, "a", cp.ID, "f", nil); !errors.Is(err, machine.ErrDamaged) {
				t.Fatalf("fork: %v", err)
			}
			if _, err := e.m.Get(ctx, "f"); !errors.Is(err, machine.ErrNotFound) {
				t.Fatalf("a refused fork left a vm: %v", err)
			}
			res, err := e.m.VerifyCheckpoint(ctx, "a", cp.ID, nil)
			if !errors.Is(err, machine.ErrDamaged) {
				t.Fatalf("verify: %v", err)
			}
			damaged := 0
			for _, r := range res {
				if r.Status == "damaged" {
					damaged++
				}
			}
			if damaged != 1 {
				t.Fatalf("verify results %+v", res)
			}
			testutil.FlipBytes(t, path, tc.off) // whole again
			if _, err := e.m.VerifyCheckpoint(ctx, "a", cp.ID, nil); err != nil {
				t.Fatal(err)
			}
			if cps, _, _ := e.m.Checkpoints(ctx, "a"); cps[0].Damaged != "" {
				t.Fatalf("mark not cleared: %q", cps[0].Damaged)
			}
			if _, err := e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{NoSave: true}, nil); err != nil {
				t.Fatalf("restore of the intact checkpoint: %v", err)
			}
		})
	}
}

// TestDamagedSuspendSlotKeepsTheVMAsleep: a wake from memory that does
// not match its digests is refused, and the VM stays asleep with its
// slot for a later look; a checkpoint still restores it.
func TestDamagedSuspendSlotKeepsTheVMAsleep(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Sleep(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	e.waitSealed(storage.SuspendDir("a"))
	testutil.FlipBytes(t, filepath.Join(e.hostDir(storage.SuspendDir("a")), machinetest.RAMFile), 33<<20)
	err = e.m.Wake(ctx, "a")
	want := `the memory "a" slept with is damaged: fake-ram extent 8 (offset 32 MiB) does not match its digest`
	if !errors.Is(err, machine.ErrDamaged) || !strings.Contains(err.Error(), want) {
		t.Fatalf("wake: %v\nwant %q", err, want)
	}
	e.wantState("a", registry.StateSleeping)
	if _, err := e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{NoSave: true}, nil); err != nil {
		t.Fatal(err)
	}
	e.wantState("a", registry.StateRunning)
}

// TestLazyRestoreVerifiesAfter: where the VMM maps memory lazily, a
// restore reads a sample first and the rest while the guest runs; damage
// the sample missed stops the VM and marks the checkpoint.
func TestLazyRestoreVerifiesAfter(t *testing.T) {
	e := newEnv(t)
	e.m.Close()
	e.drv.LazyRestore = true
	e.open()
	ctx := ctxT(t)
	e.create("a")
	cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := checkpoint.Dir("a", cp.ID)
	e.waitSealed(dir)
	// Extent 7 of 16: the sample reads the first, the last and 8 others.
	testutil.FlipBytes(t, filepath.Join(e.hostDir(dir), checkpoint.VMMDir, machinetest.RAMFile), 28<<20+5)
	_, err = e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{NoSave: true}, nil)
	switch {
	case errors.Is(err, machine.ErrDamaged):
		t.Log("the sample found the damage before the restore")
		e.wantState("a", registry.StateRunning)
	case err != nil:
		t.Fatal(err)
	default:
		testutil.WaitForWithin(t, testTimeout, "the vm stopped by the check after the restore", func() bool {
			vm := e.record("a")
			return vm.State == registry.StateStopped && strings.Contains(vm.Reason, "is damaged: vmm/fake-ram extent 7")
		})
	}
	if cps, _, _ := e.m.Checkpoints(ctx, "a"); !strings.Contains(cps[0].Damaged, "extent 7") {
		t.Fatalf("checkpoint not marked: %+v", cps)
	}
}

// TestSleepingSourceIsVerifiedBeforeACopy: a fork (or a checkpoint) of a
// sleeping VM copies its suspend slot; a damaged slot is refused, not
// passed on with new digests.
func TestSleepingSourceIsVerifiedBeforeACopy(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	if err := e.m.Sleep(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	e.waitSealed(storage.SuspendDir("a"))
	testutil.FlipBytes(t, filepath.Join(e.hostDir(storage.SuspendDir("a")), machinetest.RAMFile), 5<<20)
	if _, err := e.m.Fork(ctx, "a", "", "f", nil); !errors.Is(err, machine.ErrDamaged) {
		t.Fatalf("fork of a sleeping vm with a damaged slot: %v", err)
	}
	if _, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil); !errors.Is(err, machine.ErrDamaged) {
		t.Fatalf("checkpoint of a damaged slot: %v", err)
	}
	if cps, _, _ := e.m.Checkpoints(ctx, "a"); len(cps) != 0 {
		t.Fatalf("checkpoints left: %+v", cps)
	}
	// Its disk alone is fine to copy.
	if _, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{DiskOnly: true}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestLostDigestsAreDamage: a checkpoint recorded with digests whose
// digest files are gone is refused, as damaged.
func TestLostDigestsAreDamage(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := checkpoint.Dir("a", cp.ID)
	e.waitSealed(dir)
	ents, _ := os.ReadDir(e.hostDir(dir))
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), "digests-") {
			os.Remove(filepath.Join(e.hostDir(dir), ent.Name()))
		}
	}
	_, err = e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{}, nil)
	if !errors.Is(err, machine.ErrDamaged) || !strings.Contains(err.Error(), "has no digests") {
		t.Fatalf("restore without the memory's digests: %v", err)
	}
	os.Remove(filepath.Join(e.hostDir(dir), checkpoint.ManifestFile))
	_, err = e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{}, nil)
	if !errors.Is(err, machine.ErrDamaged) || !strings.Contains(err.Error(), "digests.json is missing") {
		t.Fatalf("restore without digests: %v", err)
	}
}
