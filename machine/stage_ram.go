package machine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/memstore"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
)

// ramStaged marks a RAM directory a restore fills ahead of its VMM:
// .staged-NAME-N. No VM name starts with a dot; guestRAM.sweep removes any a
// crash left.
const ramStaged = ".staged-"

// stagedRAM is a snapshot's memory being copied into a RAM file of its
// own ahead of the VMM that maps it (vmm.RestoreOptions.StagedMemory):
// while a restore verifies the checkpoint, saves the current state and
// stops the VM's VMM, rather than after the old VMM is gone (the memory
// is held twice for that while: it is staged only when the host has room
// for it); or, for a wake on a host with no local copy of the memory,
// read (from the host that took it, else the volume) while the wake
// verifies the snapshot and starts the VMM, rather than once it has.
type stagedRAM struct {
	dir    string // the RAM directory made for it
	local  string // the local copy it is read from, "" for the volume
	wait   func() error
	cancel context.CancelFunc
	pre    *prelaunched // the VMM prelaunched on it, if any
}

// stageRAM starts staging the memory of checkpoint cp of vm, when its
// driver stages memory and the host has room; nil otherwise.
func (ss *snapshots) stageRAM(ctx context.Context, vm registry.VM, cp registry.Checkpoint) *stagedRAM {
	d, _ := ss.m.drivers[vm.VMM].(vmm.MemoryStager)
	if d == nil || ss.m.ram.dir == "" || cp.Kind != checkpoint.KindMemoryDisk {
		return nil
	}
	// Only from a local copy: read through the volume, the staging slows
	// the verification, which reads the same memory there, more than it
	// saves (docs/benchmarks.md, "Constants set from measurements").
	local := ss.memc.local(vm.Name, checkpointKey(cp.ID, cp.Seal))
	if local == "" || !ss.roomToStage(2*vm.MemoryBytes) {
		return nil
	}
	snap, err := ss.m.vol.Path(checkpoint.Dir(vm.Name, cp.ID).Join(checkpoint.VMMDir))
	if err != nil {
		return nil
	}
	return ss.stage(ctx, d, vm.Name, snap, local, nil, "stage the memory from its local copy (beside the verification and the stop)")
}

// stageFill starts filling a RAM file with the memory the snapshot ref
// names keeps by content, read and checked as the VMM's fill is
// (fillMemory: from the copy pc names on another host, else from the
// volume), for a wake with no local copy of it, when its driver stages
// memory and the host has room; nil otherwise. The wake's
// verification does not read that memory (ref.filled), so nothing reads
// it twice.
func (ss *snapshots) stageFill(ctx context.Context, vm registry.VM, ref snapshotRef, pc peerCopy) *stagedRAM {
	d, _ := ss.m.drivers[vm.VMM].(vmm.MemoryStager)
	if d == nil || ss.m.ram.dir == "" || ref.local != "" || !ref.filled || !ss.roomToStage(vm.MemoryBytes) {
		return nil
	}
	dir, err := ss.m.vol.Path(ref.dir)
	if err != nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, memstore.ManifestFile)); err != nil {
		return nil // a memory file of its own, which the verification reads
	}
	ctx, cancel := context.WithCancel(ctx)
	fill := func(dst string) error { return ss.fillMemory(ctx, dir, dst, pc) }
	st := ss.stage(ctx, d, vm.Name, dir, "", fill, "stage the memory (beside the verification and the vmm's start)")
	if st == nil {
		cancel()
		return nil
	}
	st.cancel = cancel
	return st
}

// stage starts the staging by d of the memory of VM name's VMM snapshot
// in dir (a host path): from local, or with fill; nil if it cannot start.
func (ss *snapshots) stage(ctx context.Context, d vmm.MemoryStager, name, dir, local string, fill func(string) error, step string) *stagedRAM {
	defer phase.Begin(ctx, "stage the memory: make its RAM file")()
	st := &stagedRAM{dir: filepath.Join(ss.m.ram.dir, fmt.Sprintf("%s%s-%d", ramStaged, name, time.Now().UnixNano())),
		local: local}
	wait, err := d.StageMemory(dir, st.local, st.file(), fill)
	if err != nil {
		ss.m.log.Debug("den: stage the memory", "vm", name, "err", err)
		_ = os.RemoveAll(st.dir)
		return nil
	}
	st.wait = meanwhile(ctx, step, "", wait)
	return st
}

// roomToStage says whether the host has room to stage n bytes of memory
// beside what it holds now: MemAvailable above n and the pressure
// threshold.
func (ss *snapshots) roomToStage(n int64) bool {
	total, avail, err := hostMeminfo()
	if err != nil {
		return false
	}
	return avail > n+total*DefaultMinAvailablePercent/100
}

func (st *stagedRAM) file() string { return filepath.Join(st.dir, "memory") }

// allocated is what the staged RAM file holds on its filesystem now.
func (st *stagedRAM) allocated() int64 {
	if st == nil {
		return 0
	}
	return allocatedBytes(st.file())
}

// prelaunched is the VMM prelaunched on the staged memory, nil if none.
func (st *stagedRAM) prelaunched() *prelaunched {
	if st == nil {
		return nil
	}
	return st.pre
}

// take returns the staged RAM file and the wait for it, for the VMM; ""
// when there is none to take: it was read from a local copy that the
// verification found damaged and dropped.
func (st *stagedRAM) take() (string, func() error) {
	if st == nil {
		return "", nil
	}
	if st.local != "" {
		if _, err := os.Stat(st.local); err != nil {
			return "", nil
		}
	}
	return st.file(), st.wait
}

// drop removes what is left of the staging (all of it, unless a VMM took
// its RAM file), once its copy is over: a fill from the volume that no
// VMM waited for is cut short.
func (st *stagedRAM) drop() {
	if st == nil {
		return
	}
	st.pre.drop()
	if st.cancel != nil {
		st.cancel()
	}
	_ = st.wait()
	_ = os.RemoveAll(st.dir)
}
