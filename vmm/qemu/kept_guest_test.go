package qemu_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/vmm"
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
}
