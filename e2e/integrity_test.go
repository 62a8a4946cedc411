package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/memstore"
)

// volumePath is a file on the daemon's mounted volume.
func (d *daemon) volumePath(parts ...string) string {
	return filepath.Join(append([]string{d.state, "juicefs", "mnt"}, parts...)...)
}

// waitSealed waits until a snapshot directory's large files have their
// digests (written in the background after a checkpoint or a sleep).
func waitSealed(t *testing.T, dir string) {
	t.Helper()
	if !eventually(3*time.Minute, func() bool { return checkpoint.Sealed(dir) }) {
		t.Fatalf("no digests in %s after 3 minutes", dir)
	}
}

// keptExtent is an extent of the memory the snapshot in dir keeps by
// content, from the middle of its data: its offset in the memory, a flip
// of every copy of it the store holds (a restore passes over a damaged
// copy for a whole one: a digest found damaged before is written again),
// and the start of the line that reports it damaged (at the first place
// the memory holds its digest: a fill reads each digest once).
func (d *daemon) keptExtent(t *testing.T, dir string) (memOff int64, flip func(), want string) {
	t.Helper()
	m, err := memstore.ReadManifest(dir)
	if err != nil || len(m.Extents) < 3 {
		t.Fatalf("memory manifest of %s: %v", dir, err)
	}
	e := m.Extents[len(m.Extents)/2]
	store, err := memstore.Open(d.volumePath("memstore"))
	if err != nil {
		t.Fatal(err)
	}
	places := store.Places(e.Digest)
	if len(places) == 0 {
		t.Fatalf("no pack holds extent %d of %s", e.Index, dir)
	}
	flip = func() {
		for _, p := range places {
			testutil.FlipBytes(t, d.volumePath("memstore", "packs", p.Pack), p.At+100)
		}
	}
	first := e
	for _, x := range m.Extents {
		if x.Digest == e.Digest {
			first = x
			break
		}
	}
	return e.Off() + 100, flip, fmt.Sprintf("memory at %d MiB (extent %s", first.Off()>>20, e.Digest.String()[:16])
}

type verification struct {
	Checkpoint string `json:"checkpoint"`
	Status     string `json:"status"`
	Error      string `json:"error"`
	Files      []struct {
		File   string `json:"file"`
		Status string `json:"status"`
		Detail string `json:"detail"`
	} `json:"files"`
}

// TestCorruptedSnapshotsAreRefused: the device state, the config, a
// memory extent and a disk block of a checkpoint, and the device state,
// config and a memory extent of a suspend slot, are altered in turn:
// restore, fork and wake refuse with a line naming the file and extent,
// the VM is left as it was, den checkpoint verify names the damage, and
// the snapshot serves again once whole.
func TestCorruptedSnapshotsAreRefused(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "128M", "--idle-timeout", "0")
	d.must("exec", "box", "--", "sh", "-c", startWork)
	if id := strings.TrimSpace(d.must("checkpoint", "box", "-m", "sealed")); id != "cp-1" {
		t.Fatalf("checkpoint id %q", id)
	}
	cpDir := d.volumePath("vms", "box", "checkpoints", "cp-1")
	waitSealed(t, cpDir)
	var res []verification
	if err := json.Unmarshal([]byte(d.must("checkpoint", "verify", "box", "cp-1", "--json")), &res); err != nil || len(res) != 1 || res[0].Status != "ok" {
		t.Fatalf("intact checkpoint: %v %+v", err, res)
	}
	// The guest's changes after the checkpoint show whether a refused
	// restore touched the VM.
	d.must("exec", "box", "--", "sh", "-c", "echo after > /root/after")

	// The memory's extent is in the memory store's packs.
	memOff, flipMem, memWant := d.keptExtent(t, filepath.Join(cpDir, "vmm"))
	for _, tc := range []struct {
		name, file string
		off        int64
		want       string
	}{
		{"device state", "vmm/state", 100, "vmm/state extent 0 (offset 0 MiB) does not match its digest"},
		{"config", "vmm/config.json", 10, "vmm/config.json extent 0"},
		{"memory extent", "vmm/memory", 0, memWant},
		{"disk block", "disk", 1<<20 + 512, "disk extent 0 (offset 0 MiB) does not match its digest"},
	} {
		t.Run("checkpoint "+tc.name, func(t *testing.T) {
			flip := func() { testutil.FlipBytes(t, filepath.Join(cpDir, filepath.FromSlash(tc.file)), tc.off) }
			if tc.file == "vmm/memory" {
				flip = flipMem
			}
			flip()
			defer flip()
			if tc.file == "vmm/memory" {
				// The restore reads the local copy: damaged too, it is
				// dropped and the store's extents are checked.
				d.flipLocalMemory(t, "box", "cp-1-", memOff)
			}
			_, err := d.run("restore", "box", "cp-1")
			if err == nil || !strings.Contains(stderrOf(err), `checkpoint cp-1 of "box" is damaged: `+tc.want) {
				t.Fatalf("restore of a damaged checkpoint: %v: %s", err, stderrOf(err))
			}
			if out := d.must("exec", "box", "--", "sh", "-c", "cat /root/after; "+checkWork); out != "after\nv1\nalive\n" {
				t.Fatalf("the refused restore changed the vm: %q", out)
			}
			if cps := d.checkpoints("box"); len(cps) != 1 {
				t.Fatalf("the refused restore saved a checkpoint: %+v", cps)
			}
			if _, err := d.run("fork", "box@cp-1", "copy"); err == nil || !strings.Contains(stderrOf(err), "is damaged") {
				t.Fatalf("fork of a damaged checkpoint: %v: %s", err, stderrOf(err))
			}
			if _, err := d.run("info", "copy"); err == nil {
				t.Fatal("a refused fork left a vm")
			}
			out, err := d.run("checkpoint", "verify", "box", "cp-1")
			if err == nil || !strings.Contains(out, tc.file) || !strings.Contains(out, "damaged") {
				t.Fatalf("verify of a damaged checkpoint: %v\n%s", err, out)
			}
			if list := d.must("checkpoints", "box"); !strings.Contains(list, "DAMAGED") {
				t.Fatalf("den checkpoints does not mark it:\n%s", list)
			}
		})
	}
	// Whole again: verify clears the mark, and the checkpoint restores.
	d.must("checkpoint", "verify", "box", "cp-1")
	if list := d.must("checkpoints", "box"); strings.Contains(list, "DAMAGED") {
		t.Fatalf("mark not cleared:\n%s", list)
	}
	d.must("restore", "box", "cp-1", "--no-save")
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after restoring the intact checkpoint: %q", out)
	}

	slot := d.volumePath("vms", "box", "suspend")
	d.must("sleep", "box")
	waitSealed(t, slot)
	memOff, flipMem, memWant = d.keptExtent(t, slot)
	for _, tc := range []struct {
		name, file string
		off        int64
		want       string
	}{
		{"device state", "state", 100, "state extent 0 (offset 0 MiB) does not match its digest"},
		{"config", "config.json", 10, "config.json extent 0"},
		{"memory extent", "memory", 0, memWant},
	} {
		t.Run("suspend slot "+tc.name, func(t *testing.T) {
			flip := func() { testutil.FlipBytes(t, filepath.Join(slot, tc.file), tc.off) }
			if tc.file == "memory" {
				flip = flipMem
			}
			flip()
			defer flip()
			if tc.file == "memory" {
				d.flipLocalMemory(t, "box", "suspend-", memOff)
			}
			_, err := d.run("wake", "box")
			if err == nil || !strings.Contains(stderrOf(err), `the memory "box" slept with is damaged: `+tc.want) {
				t.Fatalf("wake from a damaged slot: %v: %s", err, stderrOf(err))
			}
			if vm := d.info("box"); vm.State != "sleeping" {
				t.Fatalf("after a refused wake: %+v", vm)
			}
		})
	}
	d.must("wake", "box")
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after a wake from the intact slot: %q", out)
	}

	// Only the local copy damaged: the wake drops it and reads the
	// volume's.
	d.must("sleep", "box")
	waitSealed(t, slot)
	memOff, _, _ = d.keptExtent(t, slot)
	local := d.flipLocalMemory(t, "box", "suspend-", memOff)
	if local == "" {
		t.Fatal("the sleep made no local copy of the memory")
	}
	d.must("wake", "box")
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after a wake past a damaged local copy: %q", out)
	}
	if _, err := os.Stat(local); !os.IsNotExist(err) {
		t.Fatalf("the damaged local copy %s is still there: %v", local, err)
	}
}

// flipLocalMemory flips two bytes at off of the VM's local memory copy
// whose name begins with prefix (STATE/memory/VM), if there is one, and
// returns its path (""); a damaged copy is dropped by den, so it is not
// flipped back.
func (d *daemon) flipLocalMemory(t *testing.T, vm, prefix string, off int64) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(d.state, "memory", vm, prefix+"*"))
	if len(m) != 1 {
		return ""
	}
	testutil.FlipBytes(t, m[0], off)
	return m[0]
}
