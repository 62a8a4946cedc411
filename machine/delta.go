package machine

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// Memory snapshots written over the last one. Writing a guest's memory
// through the volume is most of a sleep or a memory checkpoint (some
// 200 MB/s through FUSE here: 150-180 MiB of a 512 MiB guest with 64 MiB
// in use took 500-1100 ms), and between two snapshots a guest changes
// little of it (an idle one half a MiB in 5 s). So a running VM
// remembers the snapshot its RAM last equalled (its memory origin: what
// a restore read, or what a checkpoint wrote) and the local copy of that
// snapshot's memory (memcopy.go). A new snapshot clones the origin's
// memory file on the volume (metadata only) and the VMM writes over it
// only the pages of its RAM that differ from the local copy
// (vmm.DeltaSnapshotter): the file then holds exactly what the RAM holds,
// and is digested, verified and restored as any other. Without an origin,
// a local copy, a VMM that can, or when the clone fails, the memory is
// written whole.

// memOrigin is the snapshot whose memory a running VM's RAM last equalled.
type memOrigin struct {
	dir   storage.Path // the VMM's snapshot directory on the volume
	local string       // the local copy of its memory file ("" none)
	// ino is the volume's memory file's inode when the origin was
	// recorded: a file renamed into its place since (a sleep that swapped
	// its slot and then failed) is another snapshot's.
	ino uint64
}

// originBox holds an instance's memory origin.
type originBox struct {
	mu sync.Mutex
	o  memOrigin
}

func (b *originBox) get() memOrigin {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.o
}

func (b *originBox) set(o memOrigin) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.o = o
}

// setOrigin records that in's RAM now equals the memory of the VMM
// snapshot in dir, of which local is a local copy. The next snapshot
// shares its extents with dir's when both keep memory by content; it is
// written over dir's memory file only with a local copy, a VMM that
// writes over snapshots and a memory file there (else whole).
func (ss *snapshots) setOrigin(in *instance, dir storage.Path, local string) {
	o := memOrigin{dir: dir, local: local} // what a snapshot kept by content shares with
	if _, file := deltaVMM(in); file != "" && local != "" {
		if ino, err := ss.inode(dir.Join(file)); err == nil {
			o.ino = ino
		}
	}
	in.origin.set(o)
}

// deltaVMM is in's VMM as one that writes snapshots over earlier ones,
// and the memory file it writes over ("" when it does not).
func deltaVMM(in *instance) (vmm.DeltaSnapshotter, string) {
	ds, ok := in.hv.(vmm.DeltaSnapshotter)
	if !ok {
		return nil, ""
	}
	return ds, ds.DeltaMemoryFile()
}

// inode is the inode number of a file on the volume.
func (ss *snapshots) inode(p storage.Path) (uint64, error) {
	st, err := ss.m.disks.statVolume(p)
	if err != nil {
		return 0, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || !st.Mode().IsRegular() {
		return 0, fmt.Errorf("%s: not a regular file", p)
	}
	return sys.Ino, nil
}

// snapshotVMM writes the paused VM's VMM snapshot into dir, a directory
// on the volume: over a clone of its memory origin's memory when it has
// one and over says so, else whole. over is whether a local copy of the
// new snapshot's memory is being made: its digests are then made from
// that copy of the RAM, never from the file written over the origin.
func (ss *snapshots) snapshotVMM(ctx context.Context, in *instance, dir storage.Path, over bool) error {
	host, err := ss.m.vol.Path(dir)
	if err != nil {
		return fmt.Errorf("snapshot vm %q: %w", in.name, err)
	}
	if err := ss.writeVMMSnapshot(ctx, in, dir, host, over); err != nil {
		return err
	}
	return ss.m.compat.write(host, in.vmm)
}

// writeVMMSnapshot has the VMM write its snapshot into dir (at host
// path host): kept memory, over the last one's, or whole.
func (ss *snapshots) writeVMMSnapshot(ctx context.Context, in *instance, dir storage.Path, host string, over bool) error {
	if mk := ss.keeper(in.hv); mk != nil {
		return ss.snapshotKept(ctx, in.name, mk, host, ss.originDir(in), in.origin.get().local)
	}
	if over {
		if ds, base := ss.deltaBase(ctx, in, dir); base != "" {
			return ds.SnapshotOver(ctx, host, base)
		}
	}
	return in.hv.Snapshot(ctx, host)
}

// deltaBase clones in's memory origin into dir for a snapshot written
// over it, and returns the VMM that writes it and the local copy to
// compare with: "" when the snapshot is to be written whole.
func (ss *snapshots) deltaBase(ctx context.Context, in *instance, dir storage.Path) (vmm.DeltaSnapshotter, string) {
	ds, name := deltaVMM(in)
	o := in.origin.get()
	if name == "" || o.local == "" {
		return nil, ""
	}
	if st, err := os.Stat(o.local); err != nil || !st.Mode().IsRegular() {
		return nil, "" // trimmed from the copies, or dropped
	}
	if ino, err := ss.inode(o.dir.Join(name)); err != nil || o.ino == 0 || ino != o.ino {
		ss.m.log.Debug("den: snapshot memory written whole: its origin is gone or replaced", "vm", in.name, "err", err)
		return nil, ""
	}
	end := phase.Begin(ctx, "volume: clone the last snapshot's memory")
	err := ss.m.vol.Clone(ctx, o.dir.Join(name), dir.Join(name))
	end()
	if err != nil {
		ss.m.log.Warn("den: snapshot memory written whole: clone of the last snapshot's", "vm", in.name, "err", err)
		_ = ss.m.vol.Remove(context.WithoutCancel(ctx), dir.Join(name))
		return nil, ""
	}
	return ds, o.local
}
