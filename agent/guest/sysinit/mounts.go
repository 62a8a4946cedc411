//go:build linux

// Package sysinit is what den-agent does when it is init (PID 1) in a
// minimal guest: mount the API filesystems, set the hostname and
// configure the network from the kernel command line, and at the end
// stop every process, unmount and power off.
package sysinit

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode
}

var apiMounts = []mountSpec{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=620,ptmxmode=666", 0o755},
	{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
}

// MountAPI mounts /proc, /sys, /dev, /dev/pts, /dev/shm, /run and /tmp
// where they are not mounted yet (an initramfs may have moved some),
// remounts / read-write if it is read-only and adds the /dev/fd links. It goes on after a
// failure and returns all of them.
func MountAPI() error {
	var errs []error
	mounted := map[string]bool{}
	for _, m := range apiMounts {
		if m.target != "/proc" && len(mounted) == 0 {
			mounted = mountPoints()
		}
		if mounted[m.target] || (m.target == "/proc" && exists("/proc/self")) {
			continue
		}
		if err := os.MkdirAll(m.target, m.mode); err != nil {
			errs = append(errs, fmt.Errorf("mount %s: %w", m.target, err))
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
			errs = append(errs, fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err))
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err == nil && st.Flags&unix.ST_RDONLY != 0 {
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT, ""); err != nil {
			errs = append(errs, fmt.Errorf("remount / read-write: %w", err))
		}
	}
	for link, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			os.Symlink(target, link)
		}
	}
	return errors.Join(errs...)
}

// mountPoints lists the mount points in /proc/self/mountinfo.
func mountPoints() map[string]bool {
	m := map[string]bool{}
	for _, mi := range readMountinfo() {
		m[mi.target] = true
	}
	return m
}

type mountInfo struct {
	target, fstype, source string
}

func readMountinfo() []mountInfo {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if !ok || len(a) < 5 || len(b) < 2 {
			continue
		}
		out = append(out, mountInfo{target: unescape(a[4]), fstype: b[0], source: b[1]})
	}
	return out
}

func unescape(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// SetHostname sets the hostname: name if given, else /etc/hostname's.
func SetHostname(log *slog.Logger, name string) {
	if name == "" {
		data, err := os.ReadFile("/etc/hostname")
		if err != nil {
			return
		}
		name = strings.TrimSpace(string(data))
	}
	if name == "" {
		return
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		log.Warn("set hostname", "hostname", name, "err", err)
	}
}
