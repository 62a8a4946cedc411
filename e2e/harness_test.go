package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"

	"golang.org/x/sys/unix"
)

// repoRoot is the den checkout the tests run in.
func repoRoot(t testing.TB) string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	t.Fatal("no go.mod above " + wd)
	return ""
}

// requireHost skips under -short and fails (not skips) when what `make
// test` provides is missing: root, the images, juicefs.
func requireHost(t testing.TB) (den string, images image.Dir) {
	if testing.Short() {
		t.Skip("end-to-end test: needs root, images and QEMU (run without -short)")
	}
	testutil.NeedRoot(t, "end-to-end test (FUSE, VMs)")
	root := repoRoot(t)
	images, err := image.DefaultDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := images.Check(image.Minimal); err != nil {
		t.Fatalf("guest images not built (make image): %v", err)
	}
	den = filepath.Join(t.TempDir(), "den")
	// The fault tests crash den at named steps: a build with crash points.
	build := exec.Command("go", "build", "-tags", "crashpoints", "-o", den, "./cmd/den")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build den: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "juicefs")); err == nil {
		os.Setenv("DEN_JUICEFS", filepath.Join(root, "bin", "juicefs"))
	}
	return den, images
}

// daemon is a den daemon run by a test.
type daemon struct {
	t       testing.TB
	den     string
	images  image.Dir
	state   string
	socket  string
	cmd     *exec.Cmd
	logPath string
	// env is added to the daemon's environment at its next start, and
	// extraArgs to its command line.
	env       []string
	extraArgs []string
	// objects and openRegistry: see daemonSetup.
	objects      string
	openRegistry func() (*registry.DB, error)
}

// startDaemon starts a daemon on a fresh state dir (short path: unix
// sockets live under it) and waits until its socket answers.
func startDaemon(t testing.TB) *daemon {
	setup := registrySetup(t)
	d := newDaemonIn(t, setup.args)
	d.objects, d.openRegistry = setup.objects, setup.registry
	d.start()
	return d
}

// registry opens the daemon's registry, as the daemon does (with the
// daemon down: SQLite allows one writer).
func (d *daemon) registry() *registry.DB {
	d.t.Helper()
	var db *registry.DB
	var err error
	if d.openRegistry != nil {
		db, err = d.openRegistry()
	} else {
		db, err = registry.Open(filepath.Join(d.state, "den.db"))
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return db
}

// startDaemonIn is startDaemon with setup run on the test's directory
// (which will hold the state dir) first: a test mounts a small
// filesystem there, say, or writes a volume config. setup returns extra
// arguments for the daemon.
func startDaemonIn(t testing.TB, setup func(dir string) []string) *daemon {
	d := newDaemonIn(t, setup)
	d.start()
	return d
}

// newDaemonIn is startDaemonIn but for the start.
func newDaemonIn(t testing.TB, setup func(dir string) []string) *daemon {
	den, images := requireHost(t)
	dir, err := os.MkdirTemp("/tmp", "den-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	// Removed last, after the test's own cleanups (a setup that skips,
	// fails or mounts a filesystem on dir), unless kept for a
	// post-mortem; volume processes still leaving may briefly hold it.
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		var err error
		if !eventually(10*time.Second, func() bool {
			err = os.RemoveAll(dir)
			_, serr := os.Stat(dir)
			return err == nil && errors.Is(serr, fs.ErrNotExist)
		}) {
			t.Logf("remove %s: %v", dir, err)
		}
	})
	// The VMMs' user goes through to the state dir (as through /var/lib).
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	var extra []string
	if setup != nil {
		extra = setup(dir)
	}
	d := &daemon{extraArgs: extra, t: t, den: den, images: images, state: filepath.Join(dir, "state"), socket: filepath.Join(dir, "den.sock"), logPath: filepath.Join(dir, "daemon.log")}
	t.Cleanup(d.teardown)
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	d.cmd = exec.Command(d.den, "daemon", "--state-dir", d.state, "--socket", d.socket,
		"--images", d.images.Path(), "--default-image", image.Minimal, "--idle-check", "1s",
		"--ssh-listen", "127.0.0.1:0", // a port of its own: tests run side by side
		// The host's memory pressure (PSI) is other processes' too: a
		// build beside the tests put their idle VMs to sleep. Tests of
		// pressure set a MemAvailable threshold instead.
		"--memory-pressure", "0")
	if !slices.Contains(d.extraArgs, "--net") {
		// The host's own network stays as it is: tests of TAP
		// networking run their daemon in a namespace (network_test.go).
		d.cmd.Args = append(d.cmd.Args, "--net", "user")
	}
	d.cmd.Args = append(d.cmd.Args, d.extraArgs...)
	d.cmd.Env = append(os.Environ(), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", d.socket); err == nil {
			c.Close()
			return
		}
		if zombie(d.cmd.Process.Pid) {
			log, _ := os.ReadFile(d.logPath)
			d.t.Fatalf("daemon exited at its start:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(d.logPath)
	d.t.Fatalf("daemon did not come up within 60s:\n%s", log)
}

// zombie reports whether child process pid has exited, without waiting
// for it (WNOWAIT): a later Wait still reaps it.
func zombie(pid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err != nil || info.Signo != 0 // a pid that is no child of ours has exited too
}

// waitExit waits (bounded) for a daemon that is expected to die by
// itself, as at a crash point.
func (d *daemon) waitExit() {
	done := make(chan struct{})
	go func() { _, _ = d.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		d.t.Fatal("daemon did not crash at its crash point")
	}
}

// kill stops the daemon with SIGKILL, as a crash would.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	_, _ = d.cmd.Process.Wait()
}

// teardown removes every VM, stops the daemon and unmounts the volume.
func (d *daemon) teardown() {
	if out, err := d.run("ls", "--json"); err == nil {
		var vms []struct{ Name string }
		_ = json.Unmarshal([]byte(out), &vms)
		for _, vm := range vms {
			_, _ = d.run("rm", "--force", vm.Name)
		}
	}
	if d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = d.cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			d.kill()
		}
	}
	// Any VMM left over (a test that failed half-way) must not outlive it.
	killUnder(d.state)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v, err := storage.Open(ctx, storage.Config{StateDir: filepath.Join(d.state, "juicefs")}); err == nil {
		_ = v.Unmount(ctx)
	}
	_ = syscall.Unmount(filepath.Join(d.state, "ram"), syscall.MNT_DETACH) // den's tmpfs for guest RAM
	// On failure the state dir stays for a post-mortem.
	if d.t.Failed() {
		log, _ := os.ReadFile(d.logPath)
		d.t.Logf("daemon log:\n%s", log)
	}
}

// killUnder SIGKILLs QEMU processes and fence guards whose command line
// mentions dir.
func killUnder(dir string) {
	for _, pid := range pidsWhere(func(cmdline []byte) bool {
		return (bytes.Contains(cmdline, []byte("qemu")) || bytes.Contains(cmdline, []byte("\x00fence\x00"))) &&
			bytes.Contains(cmdline, []byte(dir))
	}) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// eventually polls cond until it holds (true) or within has passed
// (false). Only the poll interval sleeps: a test waits on conditions,
// never on a time that is long enough here.
func eventually(within time.Duration, cond func() bool) bool { return poll.Until(within, cond) }

// pidsWhere lists the processes whose command line (NUL-separated
// arguments) match accepts.
func pidsWhere(match func(cmdline []byte) bool) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && match(cmdline) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// vmmPIDs are the QEMU processes whose command line names a VM's
// runtime dir.
func (d *daemon) vmmPIDs(name string) []int {
	dir := []byte(filepath.Join(d.state, "run", name) + "/")
	return pidsWhere(func(cmdline []byte) bool {
		return bytes.Contains(cmdline, []byte("qemu")) && bytes.Contains(cmdline, dir)
	})
}

// run runs a den client verb and returns its stdout; err carries stderr
// and the exit status.
func (d *daemon) run(args ...string) (string, error) {
	return d.runIn(nil, args...)
}

func (d *daemon) runIn(stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.den, args...)
	cmd.Env = append(os.Environ(), "DEN_SOCKET="+d.socket)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), &runError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), nil
}

// must runs a verb that must succeed.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	out, err := d.run(args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// steps is the op and step names of the last operation the daemon
// traced for vm ("restore: lock, verify, ...").
func (d *daemon) steps(vm string) string {
	d.t.Helper()
	tr, err := api.NewClient(d.socket).Trace(context.Background(), vm)
	if err != nil {
		d.t.Fatalf("trace of %s: %v", vm, err)
	}
	var names []string
	for _, s := range tr.Steps {
		names = append(names, s.Name)
	}
	return tr.Op + ": " + strings.Join(names, ", ")
}

type runError struct {
	args   []string
	err    error
	stderr string
}

func (e *runError) Error() string {
	return fmt.Sprintf("den %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

// exitCode of a run error (0 for nil).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if re, ok := err.(*runError); ok {
		if ee, ok := re.err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
	}
	return -1
}

// stderrOf is the stderr of a failed run.
func stderrOf(err error) string {
	if re, ok := err.(*runError); ok {
		return re.stderr
	}
	return ""
}

// vmJSON is the part of `den info --json` the tests read.
type vmJSON struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Reason string `json:"reason"`
	PID    int    `json:"pid"`
	VMM    string `json:"vmm"`
	Owner  string `json:"owner"`
	Accel  string `json:"accel"`
	Host   string `json:"host"`
	// DiskUsed is what the disk holds; DiskPending says it is being
	// measured.
	DiskUsed    int64 `json:"disk_used_bytes"`
	DiskPending bool  `json:"disk_used_pending"`
}

func (d *daemon) info(name string) vmJSON {
	d.t.Helper()
	var vm vmJSON
	if err := json.Unmarshal([]byte(d.must("info", name, "--json")), &vm); err != nil {
		d.t.Fatal(err)
	}
	return vm
}
