package qemu

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/vmm"
)

// inheritedFiles opens every file QEMU inherits rather than opens by
// path (its user is not root and may reach none of them), in the order
// of their fds: each disk's read-only and read-write fd (diskFDs; the
// second a placeholder, /dev/null, for a read-only disk), each net
// device's TAP (tapFD; /dev/null without one), then the kernel and the
// initramfs (bootFD; /dev/null without one). On error none stays open.
func inheritedFiles(cfg vmm.Config) (files []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(files)
			files = nil
		}
	}()
	for _, d := range cfg.Disks {
		ro, err := os.Open(d.Path)
		if err != nil {
			return files, fmt.Errorf("disk %q: %w", d.ID, err)
		}
		files = append(files, ro)
		rwPath, flag := d.Path, os.O_RDWR
		if d.ReadOnly {
			rwPath, flag = os.DevNull, os.O_RDONLY
		}
		rw, err := os.OpenFile(rwPath, flag, 0)
		if err != nil {
			return files, fmt.Errorf("disk %q: %w", d.ID, err)
		}
		files = append(files, rw)
	}
	for _, n := range cfg.Net {
		f, err := openTap(n.Tap)
		if err != nil {
			return files, err
		}
		files = append(files, f)
	}
	for _, p := range []string{cfg.Kernel, cfg.Initramfs} {
		if p == "" {
			p = os.DevNull
		}
		f, err := os.Open(p)
		if err != nil {
			return files, fmt.Errorf("boot file: %w", err)
		}
		files = append(files, f)
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// openTap attaches to the existing TAP name (/dev/null for "") as the
// daemon (root): QEMU's user cannot open /dev/net/tun.
func openTap(name string) (*os.File, error) {
	if name == "" {
		return os.Open(os.DevNull)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open tap %s: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open tap %s: %w", name, err)
	}
	// As QEMU attaches itself: a TAP without packet information, with
	// virtio-net headers (QEMU probes the fd for them).
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("attach tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
