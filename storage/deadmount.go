package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// fuseSuperMagic is statfs's f_type of a FUSE file system.
const fuseSuperMagic = 0x65735546

// isDeadConn says whether err is what a FUSE file answers once the
// process serving its mount is gone: "transport endpoint is not
// connected" (the process died) or "software caused connection abort"
// (the connection was aborted).
func isDeadConn(err error) bool {
	return errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED)
}

// clearDeadMount removes a dead FUSE mount from the mount point: one
// whose juicefs processes were killed while no daemon ran (a crash, kill
// -9, an OOM kill). Its mount point answers every call with ENOTCONN, so
// nothing could be mounted there (mkdir says "file exists"). It is
// detached lazily, as fusermount3 -uz or umount -l do, after aborting its
// connection and killing what is left of its processes; then the mount
// point is a plain directory again and Open mounts anew. Mounts stacked
// there are taken off one at a time.
func (v *JuiceFS) clearDeadMount() error {
	mp := v.cfg.MountPoint
	for range 8 {
		_, err := os.Stat(mp)
		if !isDeadConn(err) {
			return nil
		}
		slog.Warn("storage: dead mount at the mount point (its juicefs is gone): unmounting it lazily and mounting again",
			"volume", v.cfg.Name, "mount", mp, "err", err)
		mi, ok, ferr := findMount(mp)
		if ferr != nil {
			return fmt.Errorf("dead mount at %s: %w", mp, ferr)
		}
		if !ok {
			mi = mountInfo{Point: mp}
		}
		mi.FSType = "fuse.juicefs" // teardown aborts and detaches it
		v.teardown(mi)
		if _, err := os.Stat(mp); isDeadConn(err) {
			// No privilege to detach it (not root): the setuid helper may.
			if out, ferr := exec.Command("fusermount3", "-uz", mp).CombinedOutput(); ferr != nil {
				return fmt.Errorf("dead mount at %s: lazy unmount: %w: %s", mp, ferr, strings.TrimSpace(string(out)))
			}
		}
	}
	return fmt.Errorf("dead mount at %s: still there after 8 lazy unmounts", mp)
}

// HeldOnLostMount lists the files process pid holds open on a FUSE mount
// that is not the live mount at root: a mount that died (its files
// answer "transport endpoint is not connected"), or one detached from
// root (umount -l) while the process held the file, which root now hides
// behind a new mount. A VMM holding its disk so writes to a file nothing
// will ever read again, or into an error: its VM must not run on. The
// volume is the only FUSE file system den gives a VMM, so any other FUSE
// file counts. A process that is gone holds nothing.
func HeldOnLostMount(pid int, root string) ([]string, error) {
	var live unix.Stat_t
	liveErr := unix.Stat(root, &live)
	if liveErr == nil {
		var sfs unix.Statfs_t
		if err := unix.Statfs(root, &sfs); err != nil || sfs.Type != fuseSuperMagic {
			liveErr = fmt.Errorf("%s is not a FUSE mount", root)
		}
	}
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("files of process %d: %w", pid, err)
	}
	var lost []string
	for _, e := range ents {
		fd := filepath.Join(dir, e.Name())
		var sfs unix.Statfs_t
		err := unix.Statfs(fd, &sfs)
		if err == nil && sfs.Type != fuseSuperMagic {
			continue
		}
		if err == nil {
			var st unix.Stat_t
			err = unix.Stat(fd, &st)
			if err == nil && liveErr == nil && st.Dev == live.Dev {
				continue // on the live mount
			}
		}
		if err != nil && !isDeadConn(err) {
			continue // closed meanwhile, or not ours to judge
		}
		target, rerr := os.Readlink(fd)
		if rerr != nil {
			target = "fd " + e.Name()
		}
		if !contains(lost, target) { // a VMM opens its disk more than once
			lost = append(lost, target)
		}
	}
	return lost, nil
}

// isJuiceFSMount says whether a process command line (/proc/PID/cmdline)
// is a `juicefs mount` of this volume: its cache directory (den always
// passes --cache-dir first) or its mount point (last) on it. JuiceFS
// rewrites its argv into one space-separated string, cut short when the
// line is long, so the mount point may be missing.
func isJuiceFSMount(cmdline []byte, cacheDir, point string) bool {
	s := strings.TrimRight(string(cmdline), "\x00 ")
	fields := strings.Fields(strings.ReplaceAll(s, "\x00", " "))
	if len(fields) < 3 || filepath.Base(fields[0]) != "juicefs" || !contains(fields, "mount") {
		return false
	}
	line := " " + strings.ReplaceAll(s, "\x00", " ") + " "
	return strings.Contains(line, " --cache-dir "+cacheDir+" ") || strings.HasSuffix(line, " "+point+" ")
}
