package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/vmm"
)

// inheritedFiles opens every file QEMU inherits rather than opens by
// path (its user is not root and may reach none of them), in the order
// of their fds: each disk's read-only and read-write fd (diskFDs; the
// second a placeholder, /dev/null, for a read-only disk), each net
// device's TAP (tapFD; /dev/null without one), then the kernel and the
// initramfs (bootFD; /dev/null without one). On error none stays open.
// A prelaunch (pre, nil otherwise) opens its staged disk files in place
// of the disks' paths and shares the TAPs its predecessor holds.
func inheritedFiles(ctx context.Context, cfg vmm.Config, pre *vmm.Prelaunch) (files []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(files)
			files = nil
		}
	}()
	for i, d := range cfg.Disks {
		path := d.Path
		if pre != nil && i < len(pre.DiskFiles) && pre.DiskFiles[i] != "" {
			path = pre.DiskFiles[i]
		}
		ro, err := os.Open(path)
		if err != nil {
			return files, fmt.Errorf("disk %q: %w", d.ID, err)
		}
		files = append(files, ro)
		rwPath, flag := path, os.O_RDWR
		if d.ReadOnly {
			rwPath, flag = os.DevNull, os.O_RDONLY
		}
		rw, err := os.OpenFile(rwPath, flag, 0)
		if err != nil {
			return files, fmt.Errorf("disk %q: %w", d.ID, err)
		}
		files = append(files, rw)
	}
	var pred *VMM
	if pre != nil {
		pred, _ = pre.Pred.(*VMM)
	}
	for i, n := range cfg.Net {
		var f *os.File
		if pred != nil && n.Tap != "" {
			f, err = pred.tapFile(i, n.Tap)
			if err != nil && pred.exiting(err) {
				f, err = openTapAfter(ctx, pred, n.Tap)
			}
		} else {
			f, err = openTap(n.Tap)
		}
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

// predExitWait bounds how long a prelaunch waits for a predecessor that
// is exiting to let go of its TAP (a killed QEMU is gone in milliseconds).
const predExitWait = 10 * time.Second

// exiting says whether err, from taking a file of v's process, means
// that the process is gone or on its way out: killed, it has no files
// left (pidfd_getfd: ESRCH) before its exit is noticed.
func (v *VMM) exiting(err error) bool {
	return errors.Is(err, unix.ESRCH) || !v.alive()
}

// openTapAfter attaches to TAP name once pred, exiting, has let go of it
// (a TAP without multiqueue takes one attachment).
func openTapAfter(ctx context.Context, pred *VMM, name string) (*os.File, error) {
	exited := pred.Exited()
	if exited == nil {
		return openTap(name) // it never ran
	}
	t := time.NewTimer(predExitWait)
	defer t.Stop()
	select {
	case <-exited:
	case <-ctx.Done():
		return nil, fmt.Errorf("share tap %s: wait for the old qemu to exit: %w", name, ctx.Err())
	case <-t.C:
		return nil, fmt.Errorf("share tap %s: the old qemu did not exit within %s", name, predExitWait)
	}
	return openTap(name)
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

// tapFile takes (pidfd_getfd) the fd of TAP name that this running QEMU
// holds as its net device i, for a QEMU prelaunched beside it: a TAP
// without multiqueue takes one attachment, which both then share. The
// new QEMU reads nothing from it before its guest runs, and by then
// this one is gone.
func (v *VMM) tapFile(i int, name string) (*os.File, error) {
	v.mu.Lock()
	proc, cfg := v.proc, v.cfg
	v.mu.Unlock()
	if proc == nil || cfg == nil || i >= len(cfg.Net) || cfg.Net[i].Tap != name {
		return nil, fmt.Errorf("share tap %s: the running qemu has no such tap", name)
	}
	f, err := proc.File(tapFD(*cfg, i), "/dev/net/tun:"+name)
	if err != nil {
		return nil, fmt.Errorf("share tap %s: %w", name, err)
	}
	// The fd must be that TAP's: a pid reused since would hold another.
	ifr, err := unix.NewIfreq("")
	if err == nil {
		err = unix.IoctlIfreq(int(f.Fd()), unix.TUNGETIFF, ifr)
	}
	if err != nil || ifr.Name() != name {
		f.Close()
		return nil, fmt.Errorf("share tap %s: fd %d of qemu %d is not that tap (%v)", name, tapFD(*cfg, i), proc.PID(), err)
	}
	return f, nil
}
