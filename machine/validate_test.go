//go:build linux

package machine_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// volumeTree lists what the volume holds, with sizes.
func volumeTree(t *testing.T, root string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		size := info.Size()
		if d.IsDir() {
			size = 0
		}
		out = append(out, strings.TrimPrefix(p, root)+" "+info.Mode().Type().String()+" "+strconv.FormatInt(size, 10))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestCreateRefusesBadInput: a bad owner or image name, or an image the
// manifest does not list as a root filesystem (a kernel, the initramfs,
// a file of the image directory, a name it does not list), is refused
// before any work: no record, nothing on the volume. An unknown image is
// not found, never an internal error.
func TestCreateRefusesBadInput(t *testing.T) {
	e := newEnv(t)
	man, err := e.images.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	man.Artifacts = append(man.Artifacts,
		image.Artifact{Name: "bzImage", File: "bzImage", Kind: "kernel", Key: "k"},
		image.Artifact{Name: "initramfs", File: "initramfs.img", Kind: "initramfs", Key: "i"})
	data, _ := json.Marshal(man)
	for p, b := range map[string][]byte{e.images.ManifestPath(): data, e.images.BzImage(): []byte("kernel"),
		e.images.Initramfs(): []byte("initramfs"), e.images.RootDisk("bzImage"): []byte("not an image")} {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := volumeTree(t, e.vol.Root())
	long := strings.Repeat("a", 300)
	for _, c := range []struct {
		o    machine.CreateOptions
		want error
	}{
		{machine.CreateOptions{Name: "../x"}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "a\x00b"}, machine.ErrInvalid},
		{machine.CreateOptions{Name: long}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Owner: "../x"}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Owner: "../x\x00"}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Owner: long}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Image: "../x"}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Image: "minimal\x00"}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Image: long}, machine.ErrInvalid},
		{machine.CreateOptions{Name: "x", Image: "bzImage"}, machine.ErrNotFound},
		{machine.CreateOptions{Name: "x", Image: "initramfs"}, machine.ErrNotFound},
		{machine.CreateOptions{Name: "x", Image: "vmlinux"}, machine.ErrNotFound},
		{machine.CreateOptions{Name: "x", Image: "nonesuch"}, machine.ErrNotFound},
	} {
		c.o.MemoryBytes, c.o.DiskBytes, c.o.Cold = 128<<20, imageSize, true
		_, err := e.m.Create(ctxT(t), c.o, nil)
		if !errors.Is(err, c.want) {
			t.Errorf("create %q owner %q image %q: %v, want %v", c.o.Name, c.o.Owner, c.o.Image, err, c.want)
		}
	}
	if _, err := e.m.Checkpoint(ctxT(t), "x", machine.CheckpointOptions{Comment: strings.Repeat("c", 1<<20)}, nil); !errors.Is(err, machine.ErrInvalid) {
		t.Errorf("checkpoint with a 1 MiB comment: %v", err)
	}
	vms, err := e.m.List(ctxT(t), "")
	if err != nil || len(vms) != 0 {
		t.Errorf("vms: %v %v", vms, err)
	}
	if after := volumeTree(t, e.vol.Root()); after != before {
		t.Errorf("the volume changed:\n%s\nwas:\n%s", after, before)
	}
	if e.drv.Boots() != 0 {
		t.Errorf("%d boots", e.drv.Boots())
	}
}

// TestLastActiveSurvivesRestart: activity is kept in memory (not written
// on each use), written at close and read back by the next Manager, which
// adopts the running VMM without taking that for activity: den ls and the
// idle policy see the time of the last use, not of the restart.
func TestLastActiveSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, machine.CreateOptions{Name: "box", MemoryBytes: 128 << 20, DiskBytes: imageSize,
		IdleTimeout: time.Hour, Cold: true}, nil); err != nil {
		t.Fatal(err)
	}
	created := e.record("box")
	testutil.WaitForWithin(t, testTimeout, "the clock past the creation", func() bool { return time.Since(created.LastActive) > 20*time.Millisecond })
	e.m.IdleTarget().Touch("box")
	st, err := e.m.Get(ctx, "box")
	if err != nil {
		t.Fatal(err)
	}
	used := st.LastActive.Truncate(time.Millisecond)
	if !used.After(created.LastActive) {
		t.Fatalf("last active %s after a touch, created %s", used, created.LastActive)
	}
	// Off the hot path: nothing written yet (DefaultActivitySave).
	if rec := e.record("box"); !rec.LastActive.Equal(created.LastActive) {
		t.Errorf("a touch wrote the record at once: %s", rec.LastActive)
	}

	testutil.WaitForWithin(t, testTimeout, "the clock past the use", func() bool { return time.Since(used) > 50*time.Millisecond })
	e.restart()
	rec := e.record("box")
	if !rec.LastActive.Equal(used) || rec.Generation != created.Generation {
		t.Errorf("record after a restart: last active %s gen %d, want %s gen %d", rec.LastActive, rec.Generation, used, created.Generation)
	}
	if st, err := e.m.Get(ctx, "box"); err != nil || st.State != registry.StateRunning || !st.LastActive.Equal(used) {
		t.Errorf("den ls after a restart: %s, last active %s (%v), want %s", st.State, st.LastActive, err, used)
	}
	var found bool
	for _, c := range e.m.IdleTarget().Candidates(ctx) {
		if c.Name == "box" {
			found = true
			if !c.LastActive.Equal(used) {
				t.Errorf("idle policy after a restart: last active %s, want %s", c.LastActive, used)
			}
		}
	}
	if !found {
		t.Error("box is no idle candidate after the restart")
	}
}

// TestLastActiveSavedPeriodically: while the daemon runs, activity is
// written every ActivitySave without a new generation.
func TestLastActiveSavedPeriodically(t *testing.T) {
	e := newEnv(t)
	e.m.Close()
	e.cfg.ActivitySave = 20 * time.Millisecond
	e.open()
	e.create("box")
	created := e.record("box")
	testutil.WaitForWithin(t, testTimeout, "the clock past the creation", func() bool { return time.Since(created.LastActive) > 20*time.Millisecond })
	e.m.IdleTarget().Touch("box")
	testutil.WaitForWithin(t, testTimeout, "the touch recorded", func() bool { return e.record("box").LastActive.After(created.LastActive) })
	if rec := e.record("box"); rec.Generation != created.Generation {
		t.Errorf("saving activity took generation %d, was %d", rec.Generation, created.Generation)
	}
	// An operation that read the record before goes through.
	if err := e.m.Sleep(ctxT(t), "box", false); err != nil {
		t.Fatal(err)
	}
}
