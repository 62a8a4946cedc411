//go:build linux

package guest

// Growing the root filesystem to the size of its block device, online and
// without external tools: the device of "/" from mountinfo, its size from
// sysfs, the filesystem's size from its ext4 superblock, and
// EXT4_IOC_RESIZE_FS on the mounted filesystem.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/denhq/den/agent"
	"github.com/gliderlabs/ssh"
	"golang.org/x/sys/unix"
)

// ioctlExt4ResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): its
// argument is the new block count.
const ioctlExt4ResizeFS = 0x40086610

const (
	// growDeviceWait bounds the wait for the kernel to see the device
	// size the host asked for (a virtio config-change interrupt away).
	growDeviceWait = 3 * time.Second
	growPoll       = 20 * time.Millisecond
)

// rootGrower grows the filesystem mounted at root to its device's size.
// Its paths are the guest's real ones; tests point them at a fake tree.
type rootGrower struct {
	mountinfo string // /proc/self/mountinfo
	sysfs     string // /sys
	devDir    string // /dev
	root      string // the mount point to grow, "/"
	// resize grows the filesystem mounted at root to blocks blocks.
	resize     func(root string, blocks uint64) error
	deviceWait time.Duration
	// itableInit sets init_itable or noinit_itable on root (nil: leaves
	// it); warn says what failed of it (nil: nothing).
	itableInit func(root string, on bool) error
	warn       func(msg string, args ...any)
}

// newRootGrower is the grower a server uses: mountinfo under the
// system's ProcDir, the real /sys, /dev and "/". A variable so that tests
// can point it at a fake tree (a real one would resize the host's root).
var newRootGrower = func(sys *System) *rootGrower {
	return &rootGrower{
		mountinfo:  filepath.Join(sys.ProcDir, "self", "mountinfo"),
		sysfs:      "/sys",
		devDir:     "/dev",
		root:       "/",
		resize:     ext4Resize,
		deviceWait: growDeviceWait,
		itableInit: sys.ItableInit,
	}
}

func (s *Server) ctlGrowRoot(ctx ssh.Context, payload []byte) (any, error) {
	var req agent.GrowRequest
	if err := decode("grow root filesystem", payload, &req); err != nil {
		return nil, err
	}
	if req.MinDeviceBytes < 0 {
		return nil, fmt.Errorf("grow root filesystem: min_device_bytes %d is negative", req.MinDeviceBytes)
	}
	g := newRootGrower(s.sys)
	g.warn = s.log.Warn
	rep, err := g.grow(ctx.Done(), req.MinDeviceBytes, s.freeze)
	if err == nil && rep.NewBytes != rep.OldBytes {
		s.log.Info("root filesystem grown", "device", rep.Device, "from", rep.OldBytes, "to", rep.NewBytes, "device_bytes", rep.DeviceBytes)
	}
	return rep, err
}

// grow waits (bounded) until the device holds minDevice bytes, then grows
// the filesystem to the whole device unless it fills it already. It holds
// st's lock while resizing, so that no freeze starts meanwhile, and
// refuses while filesystems are frozen.
func (g *rootGrower) grow(done <-chan struct{}, minDevice int64, st *freezeState) (agent.GrowReply, error) {
	dev, err := g.rootDevice()
	if err != nil {
		return agent.GrowReply{}, fmt.Errorf("grow root filesystem: %w", err)
	}
	rep := agent.GrowReply{Device: dev.node}
	if rep.DeviceBytes, err = g.waitDeviceSize(done, dev, minDevice); err != nil {
		return rep, fmt.Errorf("grow root filesystem: %w", err)
	}
	sb, err := readExt4Super(dev.node)
	if err != nil {
		return rep, fmt.Errorf("grow root filesystem: %w", err)
	}
	rep.OldBytes = sb.bytes()
	rep.NewBytes = rep.OldBytes
	want := uint64(rep.DeviceBytes) / sb.blockSize
	if want <= sb.blocks {
		// The groups an earlier grow added (before a reboot) are not
		// zeroed in the background either.
		if !dev.readOnly {
			st.ifThawed(func() { g.setItableInit(false) })
		}
		return rep, nil
	}
	if dev.readOnly {
		return rep, fmt.Errorf("grow root filesystem: %s is mounted read-only", g.root)
	}
	err = st.whileThawed(func() error {
		// With noinit_itable set, ext4 zeroes the new groups' inode
		// tables inside the resize (hundreds of writes back to back, on
		// the caller's time); with init_itable it leaves them to its
		// background thread, which noinit_itable then stops before it
		// starts (setItableInit).
		g.setItableInit(true)
		defer g.setItableInit(false)
		if err := g.resize(g.root, want); err != nil {
			return fmt.Errorf("%s from %d to %d blocks of %d bytes: %w", dev.node, sb.blocks, want, sb.blockSize, err)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("grow root filesystem: %w", err)
	}
	after, err := readExt4Super(dev.node)
	if err != nil {
		return rep, fmt.Errorf("grow root filesystem: after resizing: %w", err)
	}
	rep.NewBytes = after.bytes()
	return rep, nil
}

// setItableInit sets init_itable (on) or noinit_itable on the root; a
// failure only costs the background zeroing it was to spare.
func (g *rootGrower) setItableInit(on bool) {
	if g.itableInit == nil {
		return
	}
	if err := g.itableInit(g.root, on); err != nil && g.warn != nil {
		g.warn("root filesystem: inode tables", "err", err)
	}
}

// ifThawed runs fn with the freeze lock held unless filesystems are
// frozen (a frozen filesystem takes no reconfiguration).
func (st *freezeState) ifThawed(fn func()) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.frozen) == 0 {
		fn()
	}
}

// whileThawed runs fn with the freeze lock held, so that no freeze starts
// while it runs; it refuses while filesystems are frozen (a resize would
// block on the frozen filesystem until the thaw).
func (st *freezeState) whileThawed(fn func() error) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.frozen) > 0 {
		return fmt.Errorf("filesystems are frozen (%s): thaw them first", strings.Join(st.frozen, ", "))
	}
	return fn()
}

// blockDev is the block device a filesystem is mounted from.
type blockDev struct {
	name     string // kernel name, "vda"
	node     string // device node, "/dev/vda"
	sysDir   string // its sysfs directory
	readOnly bool   // the mount or the superblock is read-only
}

// rootDevice finds the device of g.root: the topmost mount of it in
// mountinfo (an ext4 filesystem), then the device's sysfs directory by
// its major:minor.
func (g *rootGrower) rootDevice() (blockDev, error) {
	f, err := os.Open(g.mountinfo)
	if err != nil {
		return blockDev{}, fmt.Errorf("find the root device: %w", err)
	}
	defer f.Close()
	m, err := findMount(f, g.root)
	if err != nil {
		return blockDev{}, fmt.Errorf("find the root device: %w", err)
	}
	if m.fstype != "ext4" {
		return blockDev{}, fmt.Errorf("%s is %s on %s: only ext4 can be grown", g.root, m.fstype, m.source)
	}
	link := filepath.Join(g.sysfs, "dev", "block", m.majMin)
	sysDir, err := filepath.EvalSymlinks(link)
	if err != nil {
		return blockDev{}, fmt.Errorf("%s is on device %s (%s), not a block device in sysfs: %w", g.root, m.majMin, m.source, err)
	}
	d := blockDev{name: filepath.Base(sysDir), sysDir: sysDir, readOnly: m.readOnly}
	if _, err := os.Stat(filepath.Join(sysDir, "partition")); err == nil {
		return blockDev{}, fmt.Errorf("%s is on partition %s: growing a partition is not supported, only a whole-disk filesystem", g.root, d.name)
	}
	d.node = filepath.Join(g.devDir, d.name)
	if _, err := os.Stat(d.node); err != nil {
		return blockDev{}, fmt.Errorf("device node of %s (%s): %w", d.name, m.majMin, err)
	}
	return d, nil
}

// mount is one line of mountinfo.
type mount struct {
	majMin, point, fstype, source string
	readOnly                      bool
}

// findMount returns the last (topmost) mount of point in mountinfo lines:
// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue".
func findMount(r io.Reader, point string) (mount, error) {
	var found *mount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 6 || len(b) < 2 || unescapeMount(a[4]) != point {
			continue
		}
		m := mount{majMin: a[2], point: point, fstype: b[0], source: unescapeMount(b[1])}
		m.readOnly = hasOpt(a[5], "ro") || (len(b) > 2 && hasOpt(b[2], "ro"))
		found = &m
	}
	if err := sc.Err(); err != nil {
		return mount{}, err
	}
	if found == nil {
		return mount{}, fmt.Errorf("no mount of %s in mountinfo", point)
	}
	return *found, nil
}

// waitDeviceSize reads the device's size from sysfs, polling until it is
// at least minBytes (when above 0), for g.deviceWait at most.
func (g *rootGrower) waitDeviceSize(done <-chan struct{}, d blockDev, minBytes int64) (int64, error) {
	deadline := time.NewTimer(g.deviceWait)
	defer deadline.Stop()
	tick := time.NewTicker(growPoll)
	defer tick.Stop()
	for {
		size, err := deviceSize(d.sysDir)
		if err != nil {
			return 0, fmt.Errorf("size of %s: %w", d.name, err)
		}
		if size >= minBytes {
			return size, nil
		}
		select {
		case <-tick.C:
			continue
		case <-deadline.C:
		case <-done:
		}
		return size, fmt.Errorf("%s is %d bytes after %s, want at least %d: the guest kernel has not seen the new disk size (was the disk resized through the VMM?)",
			d.name, size, g.deviceWait, minBytes)
	}
}

// deviceSize reads a block device's size in bytes from its sysfs
// directory (the size file counts 512-byte sectors).
func deviceSize(sysDir string) (int64, error) {
	data, err := os.ReadFile(filepath.Join(sysDir, "size"))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: %w", strings.TrimSpace(string(data)), err)
	}
	return n * 512, nil
}

// ext4Super is what growing needs of an ext4 superblock.
type ext4Super struct {
	blockSize uint64
	blocks    uint64
}

func (s ext4Super) bytes() int64 { return int64(s.blockSize * s.blocks) }

// Offsets in the ext4 superblock, which starts 1024 bytes into the device.
const (
	sbOffset          = 1024
	sbSize            = 1024
	sbBlocksLo        = 0x04
	sbLogBlockSize    = 0x18
	sbMagic           = 0x38
	sbFeatureIncompat = 0x60
	sbBlocksHi        = 0x150
	ext4Magic         = 0xEF53
	incompat64Bit     = 0x80
)

// readExt4Super reads the superblock of the ext4 filesystem on a device.
// A mounted filesystem's superblock is read through the device's page
// cache, which the kernel keeps current.
func readExt4Super(dev string) (ext4Super, error) {
	f, err := os.Open(dev)
	if err != nil {
		return ext4Super{}, fmt.Errorf("read superblock: %w", err)
	}
	defer f.Close()
	buf := make([]byte, sbSize)
	if _, err := f.ReadAt(buf, sbOffset); err != nil {
		return ext4Super{}, fmt.Errorf("read superblock of %s: %w", dev, err)
	}
	return parseExt4Super(dev, buf)
}

func parseExt4Super(dev string, b []byte) (ext4Super, error) {
	le := binary.LittleEndian
	if m := le.Uint16(b[sbMagic:]); m != ext4Magic {
		return ext4Super{}, fmt.Errorf("%s has no ext2/3/4 superblock (magic %#x)", dev, m)
	}
	logBS := le.Uint32(b[sbLogBlockSize:])
	if logBS > 6 {
		return ext4Super{}, fmt.Errorf("%s: implausible block size 1024<<%d", dev, logBS)
	}
	s := ext4Super{blockSize: 1024 << logBS, blocks: uint64(le.Uint32(b[sbBlocksLo:]))}
	if le.Uint32(b[sbFeatureIncompat:])&incompat64Bit != 0 {
		s.blocks |= uint64(le.Uint32(b[sbBlocksHi:])) << 32
	}
	return s, nil
}

// ext4Resize grows the ext4 filesystem mounted at mnt to blocks blocks
// (EXT4_IOC_RESIZE_FS, what resize2fs does on a mounted filesystem).
func ext4Resize(mnt string, blocks uint64) error {
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", mnt, err)
	}
	defer unix.Close(fd)
	n := blocks
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ioctlExt4ResizeFS, uintptr(unsafe.Pointer(&n)))
	switch {
	case e == 0:
		return nil
	case errors.Is(e, unix.ENOTTY):
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: not an ext4 filesystem: %w", e)
	case errors.Is(e, unix.EOPNOTSUPP):
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: the kernel cannot grow this filesystem online (its features, see dmesg): %w", e)
	case errors.Is(e, unix.EBUSY):
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: another resize is in progress: %w", e)
	case errors.Is(e, unix.EPERM):
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: needs CAP_SYS_RESOURCE: %w", e)
	}
	return fmt.Errorf("EXT4_IOC_RESIZE_FS (see dmesg): %w", e)
}
