package vmm

import "context"

// Driver makes and adopts the Hypervisors of one VMM on this host. Its
// Capabilities say what that VMM does, before any VM runs; what only
// some VMMs offer is an optional interface of the driver (MemoryStager,
// PrelaunchDriver). Nothing above a driver branches on a VMM's name.
type Driver interface {
	// Capabilities are the VMM's on this host (Version may be empty).
	Capabilities() Capabilities
	// New returns the Hypervisor of a VM in its runtime dir.
	New(rd RunDir) Hypervisor
	// Adopt re-attaches to the VMM running in rd.
	Adopt(ctx context.Context, rd RunDir) (Hypervisor, error)
}

// MemoryStager is a Driver that can copy a snapshot's memory into a RAM
// file ahead of the Restore that takes it (RestoreOptions.StagedMemory).
type MemoryStager interface {
	// StageMemory makes dst, a RAM file of the guest's size, and starts
	// filling it with the memory of the snapshot in dir, read from local
	// (a local copy of its memory file) or, when local is "", with fill
	// when the caller keeps the snapshot's memory (MemoryKeeper), else
	// from dir; wait waits for the copy.
	StageMemory(dir, local, dst string, fill func(dst string) error) (wait func() error, err error)
}

// PrelaunchDriver is a Driver whose VMM can be started for a restore
// beside the VM's running one (Prelauncher).
type PrelaunchDriver interface {
	// NewPrelauncher returns a VMM of VM vm in runtime dir rd, which is
	// not the VM's own: its process and cgroup are rd's, its RAM file,
	// once restored, the VM's.
	NewPrelauncher(rd RunDir, vm string) Prelauncher
}
