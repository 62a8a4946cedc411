//go:build linux

package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/agent"
	"golang.org/x/sys/unix"
)

// Freezer freezes and thaws filesystems.
type Freezer interface {
	// Mounts lists the mount points to freeze, in mount order.
	Mounts() ([]string, error)
	Freeze(mountpoint string) error
	Thaw(mountpoint string) error
}

// Freeze timeouts.
const (
	DefaultFreezeTimeout = 30 * time.Second
	MaxFreezeTimeout     = 10 * time.Minute
)

// FIFREEZE and FITHAW are _IOWR('X', 119, int) and _IOWR('X', 120, int).
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// FSFreezer freezes real filesystems with FIFREEZE: every writable mount
// of a block device listed in a mountinfo file, once per device.
type FSFreezer struct {
	mountinfo string
}

// NewFSFreezer reads mounts from mountinfo (/proc/self/mountinfo).
func NewFSFreezer(mountinfo string) *FSFreezer { return &FSFreezer{mountinfo: mountinfo} }

// Mounts implements Freezer.
func (f *FSFreezer) Mounts() ([]string, error) {
	file, err := os.Open(f.mountinfo)
	if err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	defer file.Close()
	return freezableMounts(file)
}

// freezableMounts parses mountinfo lines:
// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue".
func freezableMounts(r io.Reader) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 6 || len(b) < 2 {
			continue
		}
		dev, mnt, opts, source := a[2], unescapeMount(a[4]), a[5], b[1]
		if !strings.HasPrefix(source, "/dev/") || hasOpt(opts, "ro") || seen[dev] {
			continue
		}
		seen[dev] = true
		out = append(out, mnt)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	return out, nil
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Freeze implements Freezer.
func (f *FSFreezer) Freeze(mnt string) error { return fsIoctl(mnt, ioctlFIFREEZE) }

// Thaw implements Freezer.
func (f *FSFreezer) Thaw(mnt string) error { return fsIoctl(mnt, ioctlFITHAW) }

func fsIoctl(mnt string, req uintptr) error {
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", mnt, err)
	}
	defer unix.Close(fd)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, 0); e != 0 {
		return e
	}
	return nil
}

// freezeState tracks what the agent froze, and thaws it by itself after
// the timeout or when the connection that froze it ends.
type freezeState struct {
	fz  Freezer
	log *slog.Logger

	mu     sync.Mutex
	frozen []string // in freeze order
	gen    int
	timer  *time.Timer
	stop   chan struct{}
}

func newFreezeState(fz Freezer, log *slog.Logger) *freezeState {
	return &freezeState{fz: fz, log: log}
}

func (st *freezeState) isFrozen() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.frozen) > 0
}

// freeze freezes every mount (deepest first), or, if already frozen,
// renews the timeout. connDone ends the freeze when it closes.
func (st *freezeState) freeze(connDone <-chan struct{}, timeout time.Duration) (agent.FreezeReply, error) {
	if timeout <= 0 {
		timeout = DefaultFreezeTimeout
	}
	timeout = min(timeout, MaxFreezeTimeout)
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.frozen) == 0 {
		mounts, err := st.fz.Mounts()
		if err != nil {
			return agent.FreezeReply{}, fmt.Errorf("freeze: %w", err)
		}
		for i := len(mounts) - 1; i >= 0; i-- {
			m := mounts[i]
			err := st.fz.Freeze(m)
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) {
				st.log.Info("filesystem cannot be frozen, skipped", "mount", m)
				continue
			}
			if err != nil {
				st.thawLocked("freeze failed")
				return agent.FreezeReply{}, fmt.Errorf("freeze %s: %w", m, err)
			}
			st.frozen = append(st.frozen, m)
		}
		st.log.Info("filesystems frozen", "mounts", st.frozen, "timeout", timeout)
	}
	st.armLocked(connDone, timeout)
	return agent.FreezeReply{Frozen: append([]string(nil), st.frozen...), Until: time.Now().Add(timeout)}, nil
}

// armLocked (re)starts the automatic thaw.
func (st *freezeState) armLocked(connDone <-chan struct{}, timeout time.Duration) {
	st.disarmLocked()
	st.gen++
	gen, stop := st.gen, make(chan struct{})
	st.stop = stop
	st.timer = time.AfterFunc(timeout, func() { st.autoThaw(gen, "timeout") })
	go func() {
		select {
		case <-connDone:
			st.autoThaw(gen, "host connection closed")
		case <-stop:
		}
	}()
}

func (st *freezeState) disarmLocked() {
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	if st.stop != nil {
		close(st.stop)
		st.stop = nil
	}
}

func (st *freezeState) autoThaw(gen int, why string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if gen != st.gen || len(st.frozen) == 0 {
		return
	}
	st.log.Warn("thawing filesystems by itself", "reason", why)
	st.thawLocked(why)
}

func (st *freezeState) thaw() (agent.ThawReply, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	thawed, err := st.thawLocked("thaw request")
	return agent.ThawReply{Thawed: thawed}, err
}

func (st *freezeState) thawAll(why string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.thawLocked(why)
}

// thawLocked thaws in reverse freeze order. A mount that is not frozen
// (EINVAL) counts as thawed.
func (st *freezeState) thawLocked(why string) ([]string, error) {
	st.disarmLocked()
	st.gen++
	var thawed []string
	var errs []error
	for i := len(st.frozen) - 1; i >= 0; i-- {
		m := st.frozen[i]
		if err := st.fz.Thaw(m); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("thaw %s: %w", m, err))
			continue
		}
		thawed = append(thawed, m)
	}
	if len(st.frozen) > 0 {
		st.log.Info("filesystems thawed", "mounts", thawed, "reason", why)
	}
	st.frozen = nil
	return thawed, errors.Join(errs...)
}
