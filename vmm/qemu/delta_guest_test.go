package qemu_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/vmm"
)

// A snapshot written over an earlier one's memory holds what the RAM
// holds, restores to the guest as it was then, and is written whole when
// its base cannot be read.
func TestGuestSnapshotOver(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	c := e.boot(t, v)
	ctx := context.Background()
	if v.DeltaMemoryFile() != "memory" {
		t.Fatalf("memory file %q", v.DeltaMemoryFile())
	}
	run(t, c, "echo first > /tmp/note")
	first := e.snapshot(t, v) // written whole
	base := filepath.Join(e.dir, "base")
	if err := sparse.CopyCache(filepath.Join(first, "memory"), base); err != nil {
		t.Fatal(err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// Memory that changes: a note, and 8 MiB of a tmpfs file.
	run(t, c, "echo second > /tmp/note; head -c 8388608 /dev/urandom > /tmp/blob")
	sum, _ := run(t, c, "md5sum /tmp/blob")
	c.Close()
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	ram := vmm.RunDir(filepath.Join(e.dir, "a")).MemoryFile()
	// over snapshots into a directory holding the first snapshot's memory
	// and returns it, with the step that wrote the memory.
	over := func(name, base string) (string, string) {
		t.Helper()
		dir := filepath.Join(e.dir, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		// The volume's metadata clone of the first snapshot's memory.
		if err := sparse.Copy(filepath.Join(first, "memory"), filepath.Join(dir, "memory")); err != nil {
			t.Fatal(err)
		}
		rec := phase.New()
		if err := v.SnapshotOver(phase.With(ctx, rec), dir, base); err != nil {
			t.Fatal(err)
		}
		step := ""
		for _, s := range rec.Steps() {
			if s.Name == "qemu: write the changed memory" || s.Name == "qemu: copy the memory" {
				step = s.Name // the last: a failed write of the changes is followed by a whole copy
			}
		}
		a, err := os.ReadFile(ram)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "memory"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: the snapshot's memory differs from the paused guest's RAM", name)
		}
		return dir, step
	}
	second, step := over("second", base)
	if step != "qemu: write the changed memory" {
		t.Fatalf("the snapshot over the first was written by %q, not as changes", step)
	}
	// QEMU migrates a paused VM once: run it between two snapshots.
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, step := over("whole", filepath.Join(e.dir, "no-such-base")); step != "qemu: copy the memory" {
		t.Fatalf("a snapshot over a base that is not there was written by %q, not whole", step)
	}
	if err := v.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	w := e.newVMM(t, "b")
	if err := w.Restore(ctx, second, vmm.RestoreOptions{Resume: true}); err != nil {
		t.Fatal(err)
	}
	c2 := e.connect(t, w)
	if out, code := run(t, c2, "cat /tmp/note; md5sum /tmp/blob"); code != 0 || out != "second\n"+sum {
		t.Fatalf("after a restore of the snapshot written over the first: %q (exit %d), want %q", out, code, "second\n"+sum)
	}
}
