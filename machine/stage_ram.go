package machine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
)

// ramStaged marks a RAM directory a restore fills ahead of its VMM:
// .staged-NAME-N. No VM name starts with a dot; guestRAM.sweep removes any a
// crash left.
const ramStaged = ".staged-"

// stagedRAM is a checkpoint's memory being copied into a RAM file of its
// own while a restore verifies the checkpoint, saves the current state and
// stops the VM's VMM. The new VMM maps that file as it starts, rather than
// one it fills after the old VMM is gone (vmm.RestoreOptions.StagedMemory).
// The memory is held twice for that while: it is staged only when the host
// has room for it.
type stagedRAM struct {
	dir   string // the RAM directory made for it
	local string // the local copy it is read from
	wait  func() error
	pre   *prelaunched // the VMM prelaunched on it, if any
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
	if local == "" || !ss.roomToStage(vm.MemoryBytes) {
		return nil
	}
	snap, err := ss.m.vol.Path(checkpoint.Dir(vm.Name, cp.ID).Join(checkpoint.VMMDir))
	if err != nil {
		return nil
	}
	defer phase.Begin(ctx, "stage the memory: make its RAM file")()
	st := &stagedRAM{dir: filepath.Join(ss.m.ram.dir, fmt.Sprintf("%s%s-%d", ramStaged, vm.Name, time.Now().UnixNano())),
		local: local}
	wait, err := d.StageMemory(snap, st.local, st.file())
	if err != nil {
		ss.m.log.Debug("den: stage the memory for a restore", "vm", vm.Name, "err", err)
		_ = os.RemoveAll(st.dir)
		return nil
	}
	st.wait = meanwhile(ctx, "stage the memory from its local copy (beside the verification and the stop)", "", wait)
	return st
}

// roomToStage says whether the host has room for a second copy of a
// guest's memory beside what it holds now: MemAvailable above twice the
// guest's memory and the pressure threshold.
func (ss *snapshots) roomToStage(memory int64) bool {
	total, avail, err := hostMeminfo()
	if err != nil {
		return false
	}
	return avail > 2*memory+total*DefaultMinAvailablePercent/100
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
	if _, err := os.Stat(st.local); err != nil {
		return "", nil
	}
	return st.file(), st.wait
}

// drop removes what is left of the staging (all of it, unless a VMM took
// its RAM file), once its copy is over.
func (st *stagedRAM) drop() {
	if st == nil {
		return
	}
	st.pre.drop()
	_ = st.wait()
	_ = os.RemoveAll(st.dir)
}
