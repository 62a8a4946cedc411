package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/memstore"
	"github.com/denhq/den/vmm/qemu"
)

// Local copies of snapshots' memory. A QEMU restore copies the snapshot's
// memory file into the guest's RAM file; read through the volume's FUSE
// mount, right after the snapshot was written, that copy is most of a
// wake (some 300 ms for 110 MiB of data here, where the page cache gives
// it in a third of that). So while a VM is paused for a sleep or a
// checkpoint, and the volume's copy is being written anyway, den also
// copies the RAM file to the state dir's disk (STATE/memory/VM/KEY), and a
// wake or restore of that snapshot reads the local copy instead.
//
// A local copy is named by the snapshot's seal (the id of its digests;
// suspendKey): it is used only for that very snapshot, and it is checked against the
// snapshot's digests exactly as the volume's copy would be (a damaged one
// is dropped and the volume read). The copies are a cache: never synced,
// all dropped when a daemon starts (a crash may have torn them), kept
// within a byte budget (oldest used first out), and gone with their VM,
// checkpoint or slot.
type memCopies struct {
	dir    string
	budget int64 // bytes of disk; 0: no copies
	mu     sync.Mutex

	smu  sync.Mutex
	sums map[uint64]memstore.CopySums // each copy's own sums, by inode (memkept.go)
}

// setSums records the sums of the copy at path, made as it was.
func (c *memCopies) setSums(path string, sums memstore.CopySums) {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	if c.sums == nil {
		c.sums = map[uint64]memstore.CopySums{}
	}
	c.sums[st.Ino] = sums
}

// sumsOf are the sums the copy at path was made with, nil if unknown
// (an inode reused by another copy has other sums: the check fails, and
// the copy is then checked extent by extent).
func (c *memCopies) sumsOf(path string) memstore.CopySums {
	var st syscall.Stat_t
	if c == nil || syscall.Stat(path, &st) != nil {
		return nil
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.sums[st.Ino]
}

// suspendKey and checkpointKey name the local copy of a suspend slot's or
// a checkpoint's memory: by the snapshot's seal, or, without digests
// (--no-digests), by what else tells the snapshot: the generation of the
// VM's record the sleep left (any change to the record since makes the
// copy a miss, never a wrong hit), a checkpoint's id (never reused).
func suspendKey(seal string, generation int64) string {
	if seal == "" {
		return fmt.Sprintf("suspend-g%d", generation)
	}
	return "suspend-" + seal
}

func checkpointKey(id, seal string) string {
	if seal == "" {
		return id + "-unsealed"
	}
	return id + "-" + seal
}

// initMemCopies empties the copies' directory: copies made before this
// start may be torn.
func (ss *snapshots) initMemCopies(budget int64) error {
	ss.memc = &memCopies{dir: ss.m.state.MemoryCopies(), budget: budget}
	if err := os.RemoveAll(ss.memc.dir); err != nil {
		return err
	}
	if budget <= 0 {
		return nil
	}
	return os.MkdirAll(ss.memc.dir, 0o700)
}

// memCopyMargin is the free space a local copy leaves on the state
// dir's disk, beyond the snapshot's room.
const memCopyMargin = 1 << 30

// memCopyJob is a copy of a paused VM's RAM file under way.
type memCopyJob struct {
	c    *memCopies
	vm   string
	tmp  string
	done chan struct{}
	err  error
}

// startMemCopy copies the VM's RAM file to a temporary local file in the
// background; nil when there is nothing to copy (no budget, no RAM file:
// another VMM). The VM must stay paused until the job's wait returns.
func (ss *snapshots) startMemCopy(name string) *memCopyJob {
	c := ss.memc
	if c == nil || c.budget <= 0 {
		return nil
	}
	ram := ss.m.ram.file(name)
	st, err := os.Stat(ram)
	if err != nil || !st.Mode().IsRegular() {
		return nil
	}
	// Never at the cost of the snapshot itself, which may land on the
	// same disk (the embedded volume): room for both, and a margin.
	var fs unix.Statfs_t
	if err := unix.Statfs(c.dir, &fs); err != nil || int64(fs.Bavail)*fs.Bsize < 2*allocated(st)+memCopyMargin {
		return nil
	}
	tmp, err := c.temp(name)
	if err != nil {
		return nil
	}
	j := &memCopyJob{c: c, vm: name, tmp: tmp, done: make(chan struct{})}
	go func() {
		defer close(j.done)
		if j.err = sparse.CopyCache(ram, j.tmp); j.err != nil {
			_ = os.Remove(j.tmp)
			ss.m.log.Debug("den: local memory copy", "vm", name, "err", j.err)
			return
		}
		// Its own sums, while the VM is still paused: a wake from it
		// checks them rather than hash every extent.
		if sums, err := memstore.SumCopy(context.Background(), j.tmp); err == nil {
			c.setSums(j.tmp, sums)
		}
	}()
	return j
}

// temp makes an empty temporary file in the copies of vm (trim leaves
// it alone), for a copy to fill and rename to its key.
func (c *memCopies) temp(vm string) (string, error) {
	dir := filepath.Join(c.dir, vm)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

// wait waits for the copy (nil job: at once).
func (j *memCopyJob) wait() {
	if j != nil {
		<-j.done
	}
}

// keep names the finished copy key (dropped when key is ""), replacing
// the VM's older copies of the same slot, and trims the copies to the
// budget.
func (j *memCopyJob) keep(key string) {
	if j == nil {
		return
	}
	<-j.done
	if j.err != nil {
		return
	}
	if key == "" {
		_ = os.Remove(j.tmp)
		return
	}
	if strings.HasPrefix(key, "suspend-") {
		j.c.drop(j.vm, "suspend-")
	}
	if err := os.Rename(j.tmp, filepath.Join(j.c.dir, j.vm, key)); err != nil {
		_ = os.Remove(j.tmp)
		return
	}
	j.c.trim()
}

// drop throws the copy away.
func (j *memCopyJob) drop() { j.keep("") }

// local is the local copy named key of the VM's snapshot memory, or ""
// when there is none; a use makes it the newest for the budget.
func (c *memCopies) local(vm, key string) string {
	if c == nil || key == "" {
		return ""
	}
	p := filepath.Join(c.dir, vm, key)
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		return ""
	}
	return p
}

// drop removes the VM's copies whose names begin with prefix (all of
// them for "").
func (c *memCopies) drop(vm, prefix string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prefix == "" {
		_ = os.RemoveAll(filepath.Join(c.dir, vm))
		return
	}
	ents, _ := os.ReadDir(filepath.Join(c.dir, vm))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			_ = os.Remove(filepath.Join(c.dir, vm, e.Name()))
		}
	}
}

// trim removes the least recently used copies until they fit the budget
// (in disk blocks: the copies are sparse).
func (c *memCopies) trim() {
	c.mu.Lock()
	defer c.mu.Unlock()
	type copyFile struct {
		path string
		used int64
		at   time.Time
	}
	var all []copyFile
	var total int64
	_ = filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".tmp-") {
			return nil
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil
		}
		used := allocated(st)
		all = append(all, copyFile{p, used, st.ModTime()})
		total += used
		return nil
	})
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	for _, f := range all {
		if total <= c.budget {
			return
		}
		if err := os.Remove(f.path); err == nil || errors.Is(err, fs.ErrNotExist) {
			total -= f.used
		}
	}
}

// withLocalMemory returns ref reading its memory from the local copy
// named key, when there is one.
func (ss *snapshots) withLocalMemory(ref snapshotRef, key string) snapshotRef {
	ref.local = ss.memc.local(ref.vm, key)
	return ref
}

// memoryRel is the snapshot-relative path of the memory file a local
// copy stands for: QEMU's memory file, in a checkpoint's VMM directory.
func (r snapshotRef) memoryRel() string {
	if r.disk {
		return checkpoint.VMMDir + "/" + qemu.MemoryFile
	}
	return qemu.MemoryFile
}

// localFiles is ref's local memory copy as verification and sealing take
// it (checkpoint.Policy.Local): nil for none.
func (r snapshotRef) localFiles() map[string]string {
	if r.local == "" {
		return nil
	}
	return map[string]string{r.memoryRel(): r.local}
}

// allocated is the disk space a file's blocks take.
func allocated(st fs.FileInfo) int64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}

// baseCopies holds the local copies of warm bases' memory, as a VM's
// directory would (VM names cannot begin with a dot). A base's memory is
// read by every create from it; its local copy is made once, from the
// volume, after the first create that found none.
const baseCopies = ".bases"

// withBaseMemory returns the warm base's ref with the local copy of its
// memory when there is one, and the copy's key ("" when the base has no
// digests to name it by).
func (ss *snapshots) withBaseMemory(ref snapshotRef) (snapshotRef, string) {
	host, err := ss.m.vol.Path(ref.dir)
	if err != nil {
		return ref, ""
	}
	man, err := checkpoint.ReadManifest(host)
	if err != nil || man.Seal == "" {
		return ref, ""
	}
	key := "base-" + man.Seal
	ref.local = ss.memc.local(baseCopies, key)
	return ref, key
}

// fillBaseCopy copies a warm base's memory from the volume to its local
// copy key, in the background, unless ref has one already.
func (ss *snapshots) fillBaseCopy(ref snapshotRef, key string) {
	c := ss.memc
	if c == nil || c.budget <= 0 || key == "" || ref.local != "" {
		return
	}
	ss.m.goBackground(func() {
		if err := ss.copyBaseMemory(ref, key); err != nil {
			ss.m.log.Debug("den: local copy of a warm base's memory", "base", string(ref.dir), "err", err)
		}
	})
}

func (ss *snapshots) copyBaseMemory(ref snapshotRef, key string) error {
	c := ss.memc
	host, err := ss.m.vol.Path(ref.dir)
	if err != nil {
		return err
	}
	src := filepath.Join(host, filepath.FromSlash(ref.memoryRel()))
	fill := func(tmp string) error { return ss.fillMemory(context.Background(), filepath.Dir(src), tmp, peerCopy{}) }
	if _, err := os.Stat(filepath.Join(filepath.Dir(src), memstore.ManifestFile)); err != nil {
		if fill, err = baseMemorySource(src); err != nil { // a memory file of its own
			return err
		}
	}
	tmp, err := c.temp(baseCopies)
	if err != nil {
		return err
	}
	err = fill(tmp)
	if err == nil {
		if sums, serr := memstore.SumCopy(context.Background(), tmp); serr == nil {
			c.setSums(tmp, sums) // the inode goes with the rename
		}
		err = os.Rename(tmp, filepath.Join(c.dir, baseCopies, key))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	c.trim()
	return nil
}

// baseMemorySource is the copy of a warm base's memory file src (with
// its map) into a local copy.
func baseMemorySource(src string) (func(tmp string) error, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	var ext []sparse.Extent
	data, err := os.ReadFile(filepath.Join(filepath.Dir(src), qemu.MemoryMapFile))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &ext); err != nil {
		return nil, err
	}
	return func(tmp string) error {
		if err := os.Truncate(tmp, st.Size()); err != nil {
			return err
		}
		return sparse.CopyInto(src, tmp, ext)
	}, nil
}

// snapshots is den's snapshot store: the suspend slots, checkpoints'
// files and sizes, staged memory and disks, spare disks, local memory
// copies, and how a VMM writes a snapshot over the last one's memory.
// Files derived from a snapshot are keyed by its seal.
type snapshots struct {
	m *Manager

	memc   *memCopies // local copies of snapshots' memory (memcopy.go)
	spares *spares    // spare disks (spares.go)

	retireMu sync.Mutex
	retiring map[string]bool // VMs whose retired suspend slots are being removed: true to look again (suspend.go)
	removals chan struct{}   // bounds the removals at once

	sizing sync.Map // "vm/id" of checkpoints whose sizes are being read

	kept keptStore // the volume's memory store (memkept.go)
}
