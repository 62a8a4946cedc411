package machine

import (
	"context"
	"fmt"
	"os"

	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// diskFileSize is the size of a VM's disk file.
func (dk *disks) diskFileSize(name string) (int64, error) {
	size, err := dk.fileSize(storage.VMDisk(name))
	if err != nil {
		return 0, fmt.Errorf("vm %q: %w", name, err)
	}
	return size, nil
}

// growDiskFile extends a VM's disk file to size (never shrinks it): a
// VM that boots next sees the whole disk.
func (dk *disks) growDiskFile(name string, size int64) error {
	return dk.growFile(storage.VMDisk(name), size)
}

// statVolume stats a file on the volume.
func (dk *disks) statVolume(p storage.Path) (os.FileInfo, error) {
	host, err := dk.m.vol.Path(p)
	if err != nil {
		return nil, err
	}
	return os.Stat(host)
}

// fileSize is the apparent size of a file on the volume.
func (dk *disks) fileSize(p storage.Path) (int64, error) {
	st, err := dk.statVolume(p)
	if err != nil {
		return 0, fmt.Errorf("disk: %w", err)
	}
	return st.Size(), nil
}

// growFile grows a disk image on the volume to size (never shrinks it).
func (dk *disks) growFile(disk storage.Path, size int64) error {
	p, err := dk.m.vol.Path(disk)
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if st.Size() >= size {
		return nil
	}
	if err := os.Truncate(p, size); err != nil {
		return fmt.Errorf("grow disk to %s: %w", FormatSize(size), err)
	}
	return nil
}

// growDisk makes a running guest see and use its whole disk: the VMM
// grows the device to the VM's size where it is smaller (a restore from
// a smaller base), the guest is told, and the agent grows the root
// filesystem online to fill the device.
func (dk *disks) growDisk(ctx context.Context, vm registry.VM, in *instance) error {
	if in == nil {
		return fmt.Errorf("grow disk of vm %q: no vmm", vm.Name)
	}
	size, err := dk.diskFileSize(vm.Name)
	if err != nil {
		return err
	}
	if size < vm.DiskBytes {
		if !in.hv.Capabilities().ResizeDisk {
			// The device grows at the next boot; the file grows now.
			return dk.growDiskFile(vm.Name, vm.DiskBytes)
		}
		if err := in.hv.ResizeDisk(ctx, "root", vm.DiskBytes); err != nil {
			return fmt.Errorf("grow disk of vm %q to %s: %w", vm.Name, FormatSize(vm.DiskBytes), err)
		}
	}
	c, err := dk.m.agents.agentClient(ctx, in)
	if err != nil {
		return err
	}
	if _, err := c.GrowRoot(ctx, vm.DiskBytes); err != nil {
		return fmt.Errorf("grow the root filesystem of vm %q: %w", vm.Name, err)
	}
	return nil
}

// Resize grows a VM's disk to diskBytes (never shrinks it) and the guest's
// root filesystem with it, with no reboot: a sleeping or stopped VM is
// started first, under the same hold of its lock. The record says the new
// size once the guest has it.
func (m *Manager) Resize(ctx context.Context, name string, diskBytes int64) (_ registry.VM, err error) {
	if err := checkMiB("disk", diskBytes); err != nil {
		return registry.VM{}, fmt.Errorf("resize vm %q: %w", name, err)
	}
	if diskBytes > MaxDisk {
		return registry.VM{}, fmt.Errorf("resize vm %q: disk %s is too large: at most %s: %w", name, FormatSize(diskBytes), FormatSize(MaxDisk), ErrInvalid)
	}
	o, err := m.begin(ctx, name, "resize")
	if err != nil {
		return registry.VM{}, err
	}
	defer func() { o.end(err) }()
	vm := o.vm
	if diskBytes < vm.DiskBytes {
		return vm, fmt.Errorf("resize vm %q: disk %s is smaller than its %s (disks only grow): %w", name, FormatSize(diskBytes), FormatSize(vm.DiskBytes), ErrInvalid)
	}
	if free, err := m.guard.volumeFree(); err == nil && diskBytes-vm.DiskBytes > free {
		return vm, fmt.Errorf("resize vm %q: %s more does not fit: the volume has %s free: %w", name,
			FormatSize(diskBytes-vm.DiskBytes), FormatSize(free), ErrNoSpace)
	}
	in, err := o.run(ctx)
	if err != nil {
		return o.vm, err
	}
	grown := o.vm
	grown.DiskBytes = diskBytes
	if err := m.disks.growDisk(ctx, grown, in); err != nil {
		return o.vm, err
	}
	err = o.update(ctx, func(v *registry.VM, _ *spec) error {
		v.DiskBytes = diskBytes
		return nil
	})
	return o.vm, err
}

// checkMiB refuses a size that is not a positive whole number of MiB.
func checkMiB(what string, bytes int64) error {
	if bytes <= 0 || bytes%(1<<20) != 0 {
		return fmt.Errorf("bad %s size %d bytes: use a positive whole number of MiB, e.g. 512M or 4G: %w", what, bytes, ErrInvalid)
	}
	return nil
}

// disks sizes VM disk files and grows them, with the guest's filesystem
// (disk.go).
type disks struct{ m *Manager }
