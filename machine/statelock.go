package machine

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockStateDir makes the caller the one daemon of a state dir until the
// returned func is called (or the process ends: the kernel drops the
// lock). A second daemon on the same state dir refuses with the first
// one's PID, instead of adopting the same VMs and booting a second VMM on
// the same disk.
func LockStateDir(s StateDir) (func(), error) {
	if err := os.MkdirAll(s.Path(), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	f, err := os.OpenFile(s.DaemonLock(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another process"
			if data, rerr := os.ReadFile(s.DaemonLock()); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); perr == nil {
					who = fmt.Sprintf("pid %d", pid)
				}
			}
			return nil, fmt.Errorf("another den daemon (%s) uses state dir %s: stop it first, or use another --state-dir", who, s.Path())
		}
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}
