package qemu

import (
	"context"
	"fmt"

	"github.com/denhq/den/vmm"
)

// ResizeDisk grows a disk with QMP block_resize on its drive: QEMU
// truncates the image file and virtio-blk raises a config change, on
// which the guest kernel rereads the capacity (a paused guest on resume).
// QEMU tells the guest even when the size does not change, so this also
// announces a file that was grown before QEMU started (a restore).
func (v *VMM) ResizeDisk(ctx context.Context, id string, bytes int64) error {
	v.mu.Lock()
	cfg := v.cfg
	v.mu.Unlock()
	if cfg == nil {
		return fmt.Errorf("resize disk: no vm: %w", vmm.ErrInvalidState)
	}
	d, i, err := cfg.FindDisk(id)
	if err != nil {
		return fmt.Errorf("resize disk: %w", err)
	}
	if err := vmm.CheckDiskGrow(d, bytes); err != nil {
		return fmt.Errorf("resize disk: %w", err)
	}
	drive := driveID(d, i)
	if _, err := v.call(ctx, "block_resize", map[string]any{"device": drive, "size": bytes}); err != nil {
		return fmt.Errorf("resize disk %q to %d bytes: %w", drive, bytes, err)
	}
	return nil
}
