package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/denhq/den/vmm"
)

// ResizeDisk grows a disk (vm.resize-disk): Cloud Hypervisor resizes the
// image file and raises a virtio config change, on which the guest
// kernel rereads the capacity. The disk is looked up in vm.info, whose
// ids include the ones Cloud Hypervisor gave disks created without one;
// "" is the first disk. Both calls share ctx's deadline.
func (v *VMM) ResizeDisk(ctx context.Context, id string, bytes int64) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	info, err := v.VMInfo(ctx)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.NotCreated() {
		return fmt.Errorf("ch resize-disk: no vm: %w", vmm.ErrInvalidState)
	}
	if err != nil {
		return fmt.Errorf("ch resize-disk: %w", err)
	}
	var cfg vmm.Config
	for _, d := range info.Config.Disks {
		cfg.Disks = append(cfg.Disks, vmm.Disk{ID: d.ID, Path: d.Path, ReadOnly: d.Readonly})
	}
	d, _, err := cfg.FindDisk(id)
	if err != nil {
		return fmt.Errorf("ch resize-disk: %w", err)
	}
	if err := vmm.CheckDiskGrow(d, bytes); err != nil {
		return fmt.Errorf("ch resize-disk: %w", err)
	}
	return v.call(ctx, http.MethodPut, "vm.resize-disk", VmResizeDisk{ID: d.ID, DesiredSize: bytes}, nil)
}
