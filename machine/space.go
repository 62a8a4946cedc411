package machine

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/registry"
)

// spaceMargin is the free space every write to the volume keeps in hand
// (metadata, logs, a disk's first writes): below it operations refuse.
const spaceMargin = 64 << 20

// volumeFree is the free space where the volume's data lands: the mount
// and the local disk under it (JuiceFS's cache and metadata, and for the
// embedded volume its objects).
func (vg *volumeGuard) volumeFree() (int64, error) {
	free := int64(-1)
	for _, p := range []string{vg.m.vol.Root(), vg.m.state.VolumeState(), vg.m.state.Path()} {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			continue
		}
		f := int64(st.Bavail) * st.Bsize
		if free < 0 || f < free {
			free = f
		}
	}
	if free < 0 {
		return 0, errors.New("volume free space unknown")
	}
	return free, nil
}

// needSpace refuses an operation at once, with a line saying so, when the
// host volume has less than need (plus the margin) free: a full volume
// must fail fast, never half-write a checkpoint.
func (vg *volumeGuard) needSpace(need int64, op string) error {
	free, err := vg.volumeFree()
	if err != nil {
		return nil // unknown: the write itself will tell
	}
	if need < spaceMargin {
		need = spaceMargin
	} else {
		need += spaceMargin
	}
	if free < need {
		return fmt.Errorf("%s: host volume full (%d MB free, need %d MB): %w", op, free>>20, need>>20, ErrNoSpace)
	}
	return nil
}

// memorySnapshotNeed is what a memory snapshot of a running VM writes at
// most: the guest RAM the VMM has allocated (QEMU's RAM file is sparse:
// untouched pages cost nothing), else the VM's memory size.
func (vg *volumeGuard) memorySnapshotNeed(vm registry.VM) int64 {
	if n := vg.m.ram.allocated(vm.Name); n > 0 {
		return n
	}
	return vm.MemoryBytes
}

// needRAMSpace refuses to start a VMM whose guest RAM file (QEMU keeps
// guest memory in a file in the VM's runtime dir) could not grow to the
// guest's memory size: a full filesystem there kills the VMM with a bus
// error the moment the guest touches a page it cannot have.
func (vg *volumeGuard) needRAMSpace(vm registry.VM, staged int64) error {
	if !vg.m.vmms.caps(vm.VMM).RAMFile {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(vg.m.ram.dir, &st); err != nil {
		return nil
	}
	free := int64(st.Bavail) * st.Bsize
	need := vm.MemoryBytes - staged // a staged RAM file takes no more room
	if cur := vg.m.ram.allocated(vm.Name); cur > 0 {
		need -= cur
	}
	if free < need {
		// RAM files being freed in the background (guestRAM.discard) count
		// as free: wait for them and look again.
		vg.m.ram.frees.wait()
		if err := unix.Statfs(vg.m.ram.dir, &st); err == nil {
			free = int64(st.Bavail) * st.Bsize
		}
	}
	if free < need {
		return fmt.Errorf("start vm %q: no room for the guest's RAM (%d MB free in %s, need %d MB): %w",
			vm.Name, free>>20, vg.m.ram.dir, need>>20, ErrNoSpace)
	}
	return nil
}

// allocatedBytes is what the file at path holds on its filesystem now
// (0 if there is none).
func allocatedBytes(path string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
