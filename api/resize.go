package api

import (
	"context"
	"net/http"
)

// ResizeRequest grows a VM's disk (and the guest's root filesystem).
type ResizeRequest struct {
	// DiskBytes is the new disk size: a whole number of MiB, not smaller
	// than the current one.
	DiskBytes int64 `json:"disk_bytes"`
}

// Resize grows a VM's disk and its root filesystem, without a reboot (a
// sleeping or stopped VM is started first).
func (c *Client) Resize(ctx context.Context, name string, req ResizeRequest) (VM, error) {
	var vm VM
	err := c.do(ctx, http.MethodPost, vmPath(name, "resize"), req, &vm)
	return vm, err
}
