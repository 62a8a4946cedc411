package qemu_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// A snapshot whose memory the caller keeps holds no memory file, is
// refused by a restore that has no way to fill the RAM, and restores the
// guest as it was from the caller's fill.
func TestGuestSnapshotDevices(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	c := e.boot(t, v)
	ctx := context.Background()
	run(t, c, "echo kept > /tmp/note; head -c 4194304 /dev/urandom > /tmp/blob")
	sum, _ := run(t, c, "md5sum /tmp/blob")
	c.Close()
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(e.dir, "snap")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := v.SnapshotDevices(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(snap, "memory")); !os.IsNotExist(err) {
		t.Fatalf("a snapshot without its memory has a memory file: %v", err)
	}
	if ext, err := v.MemoryRanges(snap); err != nil || len(ext) == 0 {
		t.Fatalf("the RAM's data ranges the snapshot found: %v %v", ext, err)
	}
	if _, err := v.MemoryRanges(e.dir); err == nil {
		t.Fatal("the memory ranges of a directory with no snapshot: no error")
	}
	kept := filepath.Join(e.dir, "kept")
	if err := sparse.CopyCache(v.RAMFile(), kept); err != nil {
		t.Fatal(err)
	}
	if err := v.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.newVMM(t, "b").Restore(ctx, snap, vmm.RestoreOptions{Resume: true}); err == nil || !strings.Contains(err.Error(), "nothing fills it") {
		t.Fatalf("restore with nothing to fill the memory: %v", err)
	}
	w := e.newVMM(t, "c")
	filled := false
	fill := func(dst string) error {
		filled = true
		return sparse.CopyInto(kept, dst, nil)
	}
	if err := w.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, FillMemory: fill}); err != nil {
		t.Fatal(err)
	}
	c2 := e.connect(t, w)
	if out, code := run(t, c2, "cat /tmp/note; md5sum /tmp/blob"); code != 0 || !filled || out != "kept\n"+sum {
		t.Fatalf("after a restore from kept memory (filled %v): %q (exit %d), want %q", filled, out, code, "kept\n"+sum)
	}
	c2.Close()
	if err := w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// Staged by the caller's fill: a restore whose verification fails
	// reads none of the rest and runs nothing; one whose passes runs
	// the guest as it was.
	staged := filepath.Join(e.dir, "staged", "memory")
	if _, err := qemu.StageMemory(snap, "", staged, nil); err == nil || !strings.Contains(err.Error(), "nothing fills it") {
		t.Fatalf("staging with nothing to fill the memory: %v", err)
	}
	wait, err := qemu.StageMemory(snap, "", staged, fill)
	if err != nil {
		t.Fatal(err)
	}
	x := e.newVMM(t, "d")
	bad := errors.New("the snapshot is damaged")
	if err := x.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: staged, WaitStaged: wait, FillMemory: fill, Verified: func() error { return bad }}); !errors.Is(err, bad) {
		t.Fatalf("restore whose verification failed: %v", err)
	}
	if info, err := x.Info(ctx); err == nil && (info.State == vmm.StateRunning || info.State == vmm.StatePaused) {
		t.Fatalf("after a restore whose verification failed, its vmm is %s", info.State)
	}
	filled = false
	if wait, err = qemu.StageMemory(snap, "", staged, fill); err != nil {
		t.Fatal(err)
	}
	verified := false
	y := e.newVMM(t, "e")
	if err := y.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: staged, WaitStaged: wait, FillMemory: fill, Verified: func() error { verified = true; return nil }}); err != nil {
		t.Fatal(err)
	}
	c3 := e.connect(t, y)
	defer c3.Close()
	if out, code := run(t, c3, "cat /tmp/note; md5sum /tmp/blob"); code != 0 || !filled || !verified || out != "kept\n"+sum {
		t.Fatalf("after a restore from staged kept memory (filled %v, verified %v): %q (exit %d)", filled, verified, out, code)
	}
}
