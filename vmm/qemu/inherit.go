package qemu

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/vmm"
)

// The files QEMU inherits rather than opens by path: its user is not
// root and may reach none of them.

// openTaps opens the TAP of each of cfg's net devices for QEMU to
// inherit (tapFD), attached by the daemon (root): QEMU runs as an
// unprivileged user that cannot open /dev/net/tun. A device without a
// TAP (user-mode networking) gets a placeholder (/dev/null), so that the
// fds keep their numbers.
func openTaps(cfg vmm.Config) ([]*os.File, error) {
	var files []*os.File
	for _, n := range cfg.Net {
		f, err := openTap(n.Tap)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// openTap attaches to the existing TAP name (/dev/null for "").
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

// openBootFiles opens the kernel and the initramfs (/dev/null when there
// is none) for QEMU to inherit (bootFD).
func openBootFiles(cfg vmm.Config) ([]*os.File, error) {
	var files []*os.File
	for _, p := range []string{cfg.Kernel, cfg.Initramfs} {
		if p == "" {
			p = os.DevNull
		}
		f, err := os.Open(p)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("boot file: %w", err)
		}
		files = append(files, f)
	}
	return files, nil
}
