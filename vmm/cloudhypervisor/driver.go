package cloudhypervisor

import (
	"context"

	"github.com/denhq/den/vmm"
)

var _ vmm.Driver = (*Driver)(nil)

// Driver is Cloud Hypervisor's vmm.Driver.
type Driver struct {
	// Version is the binary's (Version), "" when not known.
	Version string
	// Options returns the options of the VMM in runtime dir rd.
	Options func(rd vmm.RunDir) Options
}

// Capabilities implements vmm.Driver.
func (d *Driver) Capabilities() vmm.Capabilities { return capabilities(d.Version) }

// New implements vmm.Driver.
func (d *Driver) New(rd vmm.RunDir) vmm.Hypervisor { return New(d.Options(rd)) }

// Adopt implements vmm.Driver.
func (d *Driver) Adopt(ctx context.Context, rd vmm.RunDir) (vmm.Hypervisor, error) {
	return Adopt(ctx, d.Options(rd))
}
