package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// JuiceFS is a Volume on a JuiceFS file system mounted with FUSE by a
// `juicefs mount` process that den starts in its own session and
// supervises. Open formats (once) and mounts it; Unmount takes it down;
// Close only stops supervising and leaves the mount for the next daemon.
type JuiceFS struct {
	cfg     Config
	bin     string
	logPath string
	opts    superviseOptions

	mu     sync.Mutex
	proc   *mountProc // the mount process we started, or nil
	subs   map[chan Event]struct{}
	closed bool

	adopted bool // Open found the mount up and took it over

	ro *readOnly // the read-only mount snapshots are read through (readonly.go); nil: none

	dev   atomic.Uint64 // st_dev of the live mount; 0 while it is down
	stop  chan struct{}
	done  chan struct{}
	probe prober
}

// mountProc is a `juicefs mount` process started by this JuiceFS.
type mountProc struct {
	cmd    *exec.Cmd
	pid    int // also its process group: it runs in a session of its own
	exited chan struct{}
	err    error // set before exited is closed
}

type superviseOptions struct {
	interval     time.Duration // between health probes
	timeout      time.Duration // one probe
	failures     int           // consecutive failed probes that mean "hung"
	mountTimeout time.Duration // a new mount must answer within this
	backoffMax   time.Duration // longest pause between remount attempts
}

var defaultSupervise = superviseOptions{
	interval:     2 * time.Second,
	timeout:      5 * time.Second,
	failures:     3,
	mountTimeout: 60 * time.Second,
	backoffMax:   30 * time.Second,
}

// Open makes the volume cfg describes ready to use: checks the object store
// (shared shape), formats the volume if it is new, mounts it or adopts a
// healthy mount left by a previous daemon, and starts supervising it.
func Open(ctx context.Context, cfg Config) (*JuiceFS, error) {
	c, err := cfg.normalize()
	if err != nil {
		return nil, fmt.Errorf("open volume %q: %w", cfg.Name, err)
	}
	wrap := func(err error) error { return fmt.Errorf("open volume %q: %w", c.Name, err) }
	bin, err := FindJuiceFS(c.JuiceFS)
	if err != nil {
		return nil, wrap(err)
	}
	if strings.HasPrefix(c.MetaURL, "postgres") {
		warnUnpatched(ctx, bin)
	}
	for _, d := range []string{c.StateDir, c.CacheDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, wrap(err)
		}
	}
	if c.S3 == nil {
		if err := os.MkdirAll(filepath.Join(c.StateDir, "objects"), 0o700); err != nil {
			return nil, wrap(err)
		}
	}
	v := &JuiceFS{
		cfg:     c,
		bin:     bin,
		logPath: filepath.Join(c.StateDir, "juicefs-"+c.Name+".log"),
		opts:    defaultSupervise,
		subs:    map[chan Event]struct{}{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if err := v.clearDeadMount(); err != nil {
		return nil, wrap(err)
	}
	if err := os.MkdirAll(c.MountPoint, 0o755); err != nil {
		return nil, wrap(err)
	}
	adopted, err := v.adopt(ctx)
	if err != nil {
		return nil, wrap(err)
	}
	v.adopted = adopted
	if !adopted {
		if err := v.format(ctx); err != nil {
			return nil, wrap(err)
		}
		if err := v.mount(ctx); err != nil {
			return nil, wrap(err)
		}
	}
	v.ro = v.openReadOnly(ctx)
	go v.supervise()
	return v, nil
}

// Adopted says whether Open took over a mount a previous daemon left
// (false: Open mounted the volume itself).
func (v *JuiceFS) Adopted() bool { return v.adopted }

// format creates the volume if its metadata is not formatted yet; an
// existing volume is left as it is (--no-update).
func (v *JuiceFS) format(ctx context.Context) error {
	args := []string{"format", "--no-update", "--trash-days", "0"}
	if s3 := v.cfg.S3; s3 != nil {
		if err := Preflight(ctx, *s3, v.cfg.Secrets); err != nil {
			return err
		}
		bucket := strings.TrimRight(s3.Endpoint, "/") + "/" + s3.Bucket
		if s3.Region != "us-east-1" {
			bucket += "?region=" + s3.Region
		}
		args = append(args, "--storage", "minio", "--bucket", bucket)
	} else {
		args = append(args, "--storage", "file", "--bucket", filepath.Join(v.cfg.StateDir, "objects")+"/")
	}
	args = append(args, v.cfg.metaURL(), v.cfg.Name)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := v.run(ctx, true, args...); err != nil {
		return fmt.Errorf("format: %w", err)
	}
	return nil
}

// mountArgs is the command line of `juicefs mount` (no secrets in it).
func (v *JuiceFS) mountArgs() []string {
	args := []string{"--no-color", "mount",
		"--cache-dir", v.cfg.CacheDir,
		"--log", v.logPath,
		"--no-usage-report",
		"--no-syslog",
	}
	if v.cfg.S3 == nil {
		// The hourly metadata backup would land on the same local disk.
		args = append(args, "--backup-meta", "0")
	}
	if v.cfg.Writeback {
		args = append(args, "--writeback")
	}
	if v.cfg.Shared {
		// Another host may have just renamed a snapshot into place.
		args = append(args, "--attr-cache", "0", "--entry-cache", "0", "--dir-entry-cache", "0")
	}
	if v.cfg.CacheSizeMiB > 0 {
		args = append(args, "--cache-size", strconv.FormatInt(v.cfg.CacheSizeMiB, 10))
	}
	return append(args, v.cfg.metaURL(), v.cfg.MountPoint)
}

// adopt takes over a healthy JuiceFS mount of this volume already at the
// mount point (a daemon restart leaves it running on purpose), without
// touching the object store, so a daemon can restart while S3 is down. A
// dead or hung one is torn down (false: mount anew).
func (v *JuiceFS) adopt(ctx context.Context) (bool, error) {
	mi, ok, err := findMount(v.cfg.MountPoint)
	if err != nil || !ok {
		return false, err
	}
	if mi.FSType != "fuse.juicefs" {
		return false, fmt.Errorf("mount point %s already holds a %s file system", v.cfg.MountPoint, mi.FSType)
	}
	name, err := v.probe.run(ctx, v.cfg.MountPoint, v.opts.timeout)
	if err != nil {
		slog.Warn("storage: stale mount, remounting", "volume", v.cfg.Name, "mount", v.cfg.MountPoint, "err", err)
		v.teardown(mi)
		return false, nil
	}
	if name != v.cfg.Name {
		return false, fmt.Errorf("mount point %s holds JuiceFS volume %q, not %q", v.cfg.MountPoint, name, v.cfg.Name)
	}
	v.dev.Store(mi.Dev)
	svc, sup, _ := v.MountPIDs()
	slog.Info("storage: adopted mount", "volume", v.cfg.Name, "mount", v.cfg.MountPoint, "pid", svc, "supervisor", sup)
	return true, nil
}

// mount starts `juicefs mount` in the foreground, in a session of its own,
// and waits until the mount answers. The process is juicefs's own
// supervisor: it restarts a crashed service process and hands it the open
// FUSE connection, so most crashes are healed without den noticing.
func (v *JuiceFS) mount(ctx context.Context) error {
	logf, err := os.OpenFile(v.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(v.bin, v.mountArgs()...)
	cmd.Env = v.cfg.env(false)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	p := &mountProc{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()

	deadline := time.NewTimer(v.opts.mountTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("mount: juicefs exited (%v): %s", p.err, v.logTail(3))
		case <-ctx.Done():
			v.abandon(p)
			return fmt.Errorf("mount: %w", ctx.Err())
		case <-deadline.C:
			v.abandon(p)
			return fmt.Errorf("mount: not ready after %s: %s", v.opts.mountTimeout, v.logTail(3))
		case <-tick.C:
		}
		mi, ok, err := findMount(v.cfg.MountPoint)
		if err != nil || !ok || mi.FSType != "fuse.juicefs" {
			continue
		}
		if _, err := v.probe.run(ctx, v.cfg.MountPoint, v.opts.timeout); err != nil {
			continue
		}
		v.mu.Lock()
		v.proc = p
		v.mu.Unlock()
		v.dev.Store(mi.Dev)
		// The process den started is juicefs's supervisor; the one
		// serving FUSE is its child, which the mount names.
		svc, _, err := v.MountPIDs()
		if err != nil {
			svc = 0
		}
		slog.Info("storage: mounted", "volume", v.cfg.Name, "mount", v.cfg.MountPoint,
			"pid", svc, "supervisor", p.pid, "took", time.Since(start).Round(time.Millisecond), "log", v.logPath)
		return nil
	}
}

// abandon kills a mount process that did not come up and removes whatever
// it mounted.
func (v *JuiceFS) abandon(p *mountProc) {
	v.kill(p)
	if mi, ok, _ := findMount(v.cfg.MountPoint); ok && mi.FSType == "fuse.juicefs" {
		v.teardown(mi)
	}
}

// kill ends a mount process and everything in its session.
func (v *JuiceFS) kill(p *mountProc) {
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		slog.Warn("storage: juicefs did not exit after SIGKILL", "pid", p.pid)
	}
}

// teardown removes a dead or hung mount: abort its FUSE connection (so
// every blocked caller gets an error instead of hanging), kill what is left
// of its processes, and detach it lazily.
func (v *JuiceFS) teardown(mi mountInfo) {
	v.dev.Store(0)
	if mi.FSType == "fuse.juicefs" {
		abort := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", mi.Minor)
		if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil && !errors.Is(err, os.ErrNotExist) {
			slog.Warn("storage: abort fuse connection", "path", abort, "err", err)
		}
	}
	v.mu.Lock()
	p := v.proc
	v.proc = nil
	v.mu.Unlock()
	if p != nil {
		v.kill(p)
	} else if pids := v.mountPIDs(); len(pids) > 0 {
		// An adopted mount: its processes are not our children.
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if mi.FSType != "fuse.juicefs" {
		return
	}
	if err := unix.Unmount(v.cfg.MountPoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		slog.Warn("storage: lazy unmount", "mount", v.cfg.MountPoint, "err", err)
	}
}

// mountPIDs finds the juicefs processes of our mount by their command
// lines (for a mount adopted from a previous daemon).
func (v *JuiceFS) mountPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && isJuiceFSMount(b, v.cfg.CacheDir, v.cfg.MountPoint) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// logTail is the end of the mount log, for error messages.
func (v *JuiceFS) logTail(n int) string {
	b, err := os.ReadFile(v.logPath)
	if err != nil {
		return "no log"
	}
	if len(b) > 64<<10 {
		b = b[len(b)-64<<10:]
	}
	return lastLines(string(b), n) + " (log " + v.logPath + ")"
}

// prober reads the volume's .config file, which only a live juicefs
// process can answer. A probe that blocks (a hung mount) is not started
// again until it returns, so hung probes do not pile up.
type prober struct {
	mu       sync.Mutex
	inflight bool
}

var errProbeStuck = errors.New("previous probe still blocked")

// run returns the volume name the mount reports.
func (p *prober) run(ctx context.Context, mp string, timeout time.Duration) (string, error) {
	p.mu.Lock()
	if p.inflight {
		p.mu.Unlock()
		return "", errProbeStuck
	}
	p.inflight = true
	p.mu.Unlock()
	type result struct {
		name string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		defer func() { p.mu.Lock(); p.inflight = false; p.mu.Unlock() }()
		b, err := os.ReadFile(filepath.Join(mp, ".config"))
		if err != nil {
			ch <- result{err: err}
			return
		}
		var conf struct {
			Format struct{ Name string }
		}
		if err := json.Unmarshal(b, &conf); err != nil {
			ch <- result{err: fmt.Errorf("parse .config: %w", err)}
			return
		}
		ch <- result{name: conf.Format.Name}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.name, r.err
	case <-t.C:
		return "", fmt.Errorf("no answer within %s", timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// MountPIDs returns the pids juicefs reports for the live mount: the
// service process and its supervisor. Tests use it to inject faults.
func (v *JuiceFS) MountPIDs() (service, supervisor int, err error) {
	b, err := os.ReadFile(filepath.Join(v.cfg.MountPoint, ".config"))
	if err != nil {
		return 0, 0, fmt.Errorf("volume %q: %w", v.cfg.Name, err)
	}
	var conf struct{ Pid, PPid int }
	if err := json.Unmarshal(b, &conf); err != nil {
		return 0, 0, fmt.Errorf("volume %q: parse .config: %w", v.cfg.Name, err)
	}
	return conf.Pid, conf.PPid, nil
}

// Unmount stops supervising and unmounts the volume cleanly: juicefs
// flushes what it buffered and exits. It fails with the volume still
// mounted if files are open on it, unless ctx runs out, in which case the
// mount is detached lazily and its processes are killed.
func (v *JuiceFS) Unmount(ctx context.Context) error {
	v.stopSupervising()
	defer v.Close()
	v.unmountReadOnly()
	wrap := func(err error) error { return fmt.Errorf("unmount volume %q: %w", v.cfg.Name, err) }
	mi, ok, err := findMount(v.cfg.MountPoint)
	if err != nil {
		return wrap(err)
	}
	if !ok {
		return nil
	}
	v.dev.Store(0)
	for {
		err := unix.Unmount(v.cfg.MountPoint, 0)
		if err == nil || errors.Is(err, unix.EINVAL) {
			break
		}
		if !errors.Is(err, unix.EBUSY) {
			return wrap(err)
		}
		select {
		case <-ctx.Done():
			v.teardown(mi)
			return wrap(fmt.Errorf("busy until %w: detached lazily", ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
	v.mu.Lock()
	p := v.proc
	v.proc = nil
	v.mu.Unlock()
	if p != nil {
		select {
		case <-p.exited:
		case <-ctx.Done():
			v.kill(p)
		}
	}
	slog.Info("storage: unmounted", "volume", v.cfg.Name, "mount", v.cfg.MountPoint)
	v.emit(Event{Kind: EventUnmounted})
	return nil
}
