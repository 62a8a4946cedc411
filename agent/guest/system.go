//go:build linux

package guest

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/agent"
)

// System is the guest's privileged operations, replaceable in tests.
type System struct {
	// SetClock steps the wall clock.
	SetClock func(time.Time) error
	// Freezer freezes and thaws filesystems.
	Freezer Freezer
	// SetHostname sets the kernel's hostname.
	SetHostname func(string) error
	// SetMAC gives a network interface a new hardware address; nil
	// cannot (a new identity's MAC is then refused).
	SetMAC func(ifname string, mac net.HardwareAddr) error
	// SetNet replaces a network interface's addresses, default route
	// and resolver; nil cannot (a new identity's network is then
	// refused).
	SetNet func(ifname string, c agent.NetConfig) error
	// Reseed mixes host randomness into the kernel RNG and reseeds it.
	Reseed func(entropy []byte) error
	// ItableInit sets whether the kernel zeroes the inode tables of the
	// ext4 filesystem mounted at a path in the background (init_itable,
	// noinit_itable); nil: leave it as it is.
	ItableInit func(mnt string, on bool) error
	// Poweroff stops the guest; nil refuses poweroff requests. It is
	// called in its own goroutine after the reply has been sent.
	Poweroff func(reboot bool)
	// TrustCA puts a CA of den's in the guest's trust store, in place of
	// the one before, and says which file holds it; nil refuses.
	TrustCA func(pem []byte) (string, error)
	// EtcDir holds passwd, group, hostname, hosts and machine-id.
	EtcDir string
	// ProcDir is procfs.
	ProcDir string
	// PID1 says the agent is init.
	PID1 bool
}

// DefaultSystem is the real guest: Linux syscalls, /etc and /proc.
func DefaultSystem() *System {
	return &System{
		SetClock:    setRealtime,
		Freezer:     NewFSFreezer("/proc/self/mountinfo"),
		SetHostname: func(h string) error { return unix.Sethostname([]byte(h)) },
		Reseed:      reseedKernelRNG,
		ItableInit:  setItableInit,
		TrustCA:     func(pem []byte) (string, error) { return trustCA("/", pem) },
		EtcDir:      "/etc",
		ProcDir:     "/proc",
		PID1:        os.Getpid() == 1,
	}
}

func setRealtime(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

// reseedKernelRNG credits entropy to the kernel's input pool
// (RNDADDENTROPY), writes it to /dev/urandom as well, and forces the CRNG
// to reseed (RNDRESEEDCRNG), so that user space reading random numbers
// after this point, the vDSO getrandom included, diverges from any other
// copy of this VM.
func reseedKernelRNG(entropy []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed rng: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(entropy)+3)
	binary.NativeEndian.PutUint32(info[0:], uint32(8*len(entropy)))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(entropy)))
	copy(info[8:], entropy)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return fmt.Errorf("reseed rng: RNDADDENTROPY: %w", e)
	}
	if _, err := f.Write(entropy); err != nil {
		return fmt.Errorf("reseed rng: write /dev/urandom: %w", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("reseed rng: RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// uptime is the time since boot (CLOCK_BOOTTIME).
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// setItableInit sets init_itable (on) or noinit_itable on the ext4
// filesystem mounted at mnt: whether the kernel's ext4lazyinit thread
// zeroes the inode tables of the block groups not zeroed yet (the groups
// an online grow adds). The superblock is reconfigured through fspick,
// which changes that one option and none of the filesystem's or its
// mounts' others.
//
// den's root filesystems run with noinit_itable (rootGrower.grow). The
// zeroing is needless on den's disks: sparse files, whose grown space
// reads as zeros already. It is not free: after a VM's disk grew from the
// image's 256 MiB to 4 GiB, the guest wrote zeros over 480 inode tables
// for half a minute, one 512 KiB write (a hole punched, one transaction
// of the volume's metadata) every 70 ms, in every VM made from the warm
// base, and again after each restore to a checkpoint taken meanwhile.
// ext4 does not need the tables zeroed: the groups' descriptors say
// which inodes were never used (uninit_bg, metadata_csum).
func setItableInit(mnt string, on bool) error {
	opt := "noinit_itable"
	if on {
		opt = "init_itable"
	}
	fd, err := unix.Fspick(unix.AT_FDCWD, mnt, unix.FSPICK_CLOEXEC)
	if err != nil {
		return fmt.Errorf("%s on %s: fspick: %w", opt, mnt, err)
	}
	defer unix.Close(fd)
	if err := unix.FsconfigSetFlag(fd, opt); err != nil {
		return fmt.Errorf("%s on %s: %w", opt, mnt, err)
	}
	if err := unix.FsconfigReconfigure(fd); err != nil {
		return fmt.Errorf("%s on %s: reconfigure: %w", opt, mnt, err)
	}
	return nil
}
