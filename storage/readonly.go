package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The volume's read-only mount. JuiceFS compacts a chunk made of five
// slices or more into one new slice whenever it is read: new objects,
// where a clone's chunk shared its source's. A checkpoint's disk is a
// clone of a disk its guest wrote in many small pieces, so each read den
// makes of it for itself (its digests, its verification, its size) would
// store what it read a second time: 130-210 MiB per checkpoint of an idle
// VM here, in its first minutes. A read-only JuiceFS client never
// compacts: den reads snapshots through a second, read-only mount of the
// same volume (its mount point with "-ro" appended), and through the
// volume's own only while that one is down. Guests read their disks
// through the volume's own mount: an active disk compacts as it always
// did.
type readOnly struct {
	point, cache, log string
	proc              *mountProc // nil: adopted from a previous daemon
	dev               uint64     // st_dev of the mount
	up                atomic.Bool
}

// readOnlyArgs is the command line of the read-only mount: no caches of
// metadata (a snapshot the other mount just wrote must show at once).
func (v *JuiceFS) readOnlyArgs(r *readOnly) []string {
	return []string{"--no-color", "mount", "--read-only",
		"--cache-dir", r.cache, "--log", r.log,
		"--no-usage-report", "--no-syslog", "--backup-meta", "0",
		"--attr-cache", "0", "--entry-cache", "0", "--dir-entry-cache", "0",
		v.cfg.metaURL(), r.point}
}

// openReadOnly mounts the volume read-only beside its mount, or adopts
// such a mount a previous daemon left; nil when it cannot (den then reads
// through the volume's own mount).
func (v *JuiceFS) openReadOnly(ctx context.Context) *readOnly {
	r := &readOnly{point: v.cfg.MountPoint + "-ro", cache: v.cfg.CacheDir + "-ro",
		log: filepath.Join(v.cfg.StateDir, "juicefs-"+v.cfg.Name+"-ro.log")}
	fail := func(err error) *readOnly {
		slog.Warn("storage: no read-only mount: snapshots are read through the volume's own (reads compact clones)", "volume", v.cfg.Name, "err", err)
		return nil
	}
	if _, err := os.Stat(r.point); isDeadConn(err) {
		_ = unix.Unmount(r.point, unix.MNT_DETACH)
	}
	for _, d := range []string{r.point, r.cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail(err)
		}
	}
	if mi, ok, err := findMount(r.point); err == nil && ok && mi.FSType == "fuse.juicefs" {
		var p prober
		if name, err := p.run(ctx, r.point, v.opts.timeout); err == nil && name == v.cfg.Name {
			r.dev = mi.Dev
			r.up.Store(true)
			return r
		}
		_ = unix.Unmount(r.point, unix.MNT_DETACH)
	}
	logf, err := os.OpenFile(r.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	cmd := exec.Command(v.bin, v.readOnlyArgs(r)...)
	cmd.Env = v.cfg.env(false)
	cmd.Stdout, cmd.Stderr, cmd.Dir = logf, logf, "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	p := &mountProc{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
		if r.up.Swap(false) {
			slog.Warn("storage: the read-only mount exited: snapshots are read through the volume's own", "volume", v.cfg.Name, "err", p.err)
		}
	}()
	r.proc = p
	deadline := time.Now().Add(v.opts.mountTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fail(fmt.Errorf("juicefs exited: %v", p.err))
		case <-ctx.Done():
			v.kill(p)
			return fail(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		mi, ok, err := findMount(r.point)
		if err != nil || !ok || mi.FSType != "fuse.juicefs" {
			continue
		}
		var pr prober
		if _, err := pr.run(ctx, r.point, v.opts.timeout); err == nil {
			r.dev = mi.Dev
			r.up.Store(true)
			return r
		}
	}
	v.kill(p)
	_ = unix.Unmount(r.point, unix.MNT_DETACH)
	return fail(errors.New("not ready in time"))
}

// readRoot is where den reads snapshots: the read-only mount while it is
// up, else the volume's own.
func (v *JuiceFS) readRoot() string {
	if r := v.ro; r != nil && r.up.Load() {
		// Still the mount it was (an adopted one's process is not ours
		// to watch): a stat, which a dead FUSE mount fails at once.
		var st unix.Stat_t
		if err := unix.Stat(r.point, &st); err == nil && st.Dev == r.dev {
			return r.point
		}
		if r.up.Swap(false) {
			slog.Warn("storage: the read-only mount is gone: snapshots are read through the volume's own", "volume", v.cfg.Name, "mount", r.point)
		}
	}
	return v.cfg.MountPoint
}

// ReadRoot is the host directory den reads snapshots under.
func (v *JuiceFS) ReadRoot() string { return v.readRoot() }

// ReadPath is the host path of p for reading: under the read-only mount
// while it is up (reads there never compact a clone's chunks), else
// under the volume's own.
func (v *JuiceFS) ReadPath(p Path) (string, error) {
	_, hp, err := v.readHost(p)
	return hp, err
}

// readHost is the read root and p's host path under it.
func (v *JuiceFS) readHost(p Path) (root, hp string, err error) {
	if _, err := v.live(p); err != nil {
		return "", "", err
	}
	root = v.readRoot()
	hp, err = hostPath(root, p)
	return root, hp, err
}

// unmountReadOnly takes the read-only mount down.
func (v *JuiceFS) unmountReadOnly() {
	r := v.ro
	if r == nil {
		return
	}
	r.up.Store(false)
	if err := unix.Unmount(r.point, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		_ = unix.Unmount(r.point, unix.MNT_DETACH)
	}
	if r.proc != nil {
		select {
		case <-r.proc.exited:
		case <-time.After(5 * time.Second):
			v.kill(r.proc)
		}
		return
	}
	// Adopted: its processes are not our children.
	for _, pid := range pidsOfMount(r.point) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// pidsOfMount finds the juicefs processes whose command line ends with
// mount point mp.
func pidsOfMount(mp string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(b), "juicefs") {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 0 && args[len(args)-1] == mp {
			var pid int
			if _, err := fmt.Sscan(e.Name(), &pid); err == nil && pid != os.Getpid() {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
