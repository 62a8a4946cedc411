//go:build linux

package sysinit

import (
	"log/slog"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Shutdown ends the guest as init must: SIGTERM to every process, SIGKILL
// to what is left, sync, unmount the real filesystems, remount / read-only
// and power off (or reboot). It does not return.
func Shutdown(log *slog.Logger, reboot bool) {
	log.Info("stopping all processes")
	unix.Kill(-1, unix.SIGTERM)
	if !waitChildren(time.Now().Add(3 * time.Second)) {
		log.Warn("processes left after SIGTERM, killing them")
		unix.Kill(-1, unix.SIGKILL)
		waitChildren(time.Now().Add(2 * time.Second))
	}
	unix.Sync()
	mounts := readMountinfo()
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if m.target == "/" || !strings.HasPrefix(m.source, "/dev/") {
			continue
		}
		if err := unix.Unmount(m.target, 0); err != nil {
			log.Warn("unmount", "mount", m.target, "err", err)
			unix.Unmount(m.target, unix.MNT_DETACH)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		log.Warn("remount / read-only", "err", err)
	}
	unix.Sync()
	cmd, what := unix.LINUX_REBOOT_CMD_POWER_OFF, "power off"
	if reboot {
		cmd, what = unix.LINUX_REBOOT_CMD_RESTART, "reboot"
	}
	log.Info("system " + what)
	err := unix.Reboot(cmd)
	log.Error("reboot syscall failed; halting here", "err", err)
	select {}
}

// waitChildren reaps until no child is left or the deadline passes; it
// reports whether none is left.
func waitChildren(deadline time.Time) bool {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.ECHILD {
			return true
		}
		if pid > 0 {
			continue
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
