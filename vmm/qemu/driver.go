package qemu

import (
	"context"

	"github.com/denhq/den/vmm"
)

var (
	_ vmm.Driver          = (*Driver)(nil)
	_ vmm.MemoryStager    = (*Driver)(nil)
	_ vmm.PrelaunchDriver = (*Driver)(nil)
)

// Driver is QEMU's vmm.Driver.
type Driver struct {
	// Accel is the accelerator VMs run under ("kvm", "tcg"), resolved.
	Accel string
	// Version is the QEMU binary's (Version), "" when not known.
	Version string
	// Options returns the options of the VMM in runtime dir rd whose
	// RAM file is VM vm's (rd's own VM but for a prelaunch); their Accel
	// is the driver's.
	Options func(rd vmm.RunDir, vm string) Options
}

// options are the options of the VMM in rd whose RAM file is vm's.
func (d *Driver) options(rd vmm.RunDir, vm string) Options {
	o := d.Options(rd, vm)
	o.Accel = d.Accel
	return o
}

// Capabilities implements vmm.Driver.
func (d *Driver) Capabilities() vmm.Capabilities { return capabilities(d.Accel, d.Version) }

// New implements vmm.Driver.
func (d *Driver) New(rd vmm.RunDir) vmm.Hypervisor { return New(d.options(rd, rd.Name())) }

// Adopt implements vmm.Driver.
func (d *Driver) Adopt(ctx context.Context, rd vmm.RunDir) (vmm.Hypervisor, error) {
	return Adopt(ctx, d.options(rd, rd.Name()))
}

// StageMemory implements vmm.MemoryStager.
func (d *Driver) StageMemory(dir, local, dst string, fill func(dst string) error) (func() error, error) {
	return StageMemory(dir, local, dst, fill)
}

// NewPrelauncher implements vmm.PrelaunchDriver.
func (d *Driver) NewPrelauncher(rd vmm.RunDir, vm string) vmm.Prelauncher {
	return New(d.options(rd, vm))
}
