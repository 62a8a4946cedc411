package storage

import (
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/testutil"
	"golang.org/x/sys/unix"
)

// captureLog sends storage's log lines (slog's default logger) to a
// buffer until the test ends.
func captureLog(t *testing.T) *testutil.Buffer {
	var buf testutil.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

// holdOpen starts a process that holds path open (as a VMM holds its
// disk) until the test ends, and returns its pid.
func holdOpen(t *testing.T, path string) int {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("sleep", "1000")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// killMount kills a mount's juicefs processes (supervisor and service),
// and the test waits until they are gone.
func killMount(t *testing.T, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if !poll.Until(10*time.Second, func() bool {
		for _, pid := range pids {
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("juicefs processes %v still alive after SIGKILL", pids)
	}
}

// TestOpenOverDeadMount: the daemon and the volume's juicefs processes
// were killed (-9); the mount point is left a dead FUSE mount (stat:
// "transport endpoint is not connected"). Open takes it off lazily, says
// so, and mounts again; a process that held a file on the dead mount is
// reported as holding it on a lost mount, one holding it on the new mount
// is not.
func TestOpenOverDeadMount(t *testing.T) {
	needIntegration(t)
	logs := captureLog(t)
	cfg := Config{StateDir: t.TempDir()}
	v := openVolume(t, cfg)
	path, sum := diskWithData(t, v, "box")
	holder := holdOpen(t, path)
	svc, sup, err := v.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	if held, err := HeldOnLostMount(holder, v.Root()); err != nil || len(held) != 0 {
		t.Fatalf("a file held on the live mount: %v, %v", held, err)
	}
	v.Close() // the daemon goes; its mount stays
	killMount(t, svc, sup)
	if !poll.Until(10*time.Second, func() bool {
		_, err := os.Stat(v.Root())
		return isDeadConn(err)
	}) {
		_, err := os.Stat(v.Root())
		t.Fatalf("the mount point after its juicefs was killed: %v, want ENOTCONN", err)
	}

	v2 := openVolume(t, cfg)
	if !strings.Contains(logs.String(), "dead mount at the mount point") {
		t.Errorf("no log line about the dead mount:\n%s", logs)
	}
	waitHealthy(t, v2, 10*time.Second)
	if got := sha(t, path); got != sum {
		t.Fatal("data changed across the dead mount")
	}
	held, err := HeldOnLostMount(holder, v2.Root())
	if err != nil || len(held) != 1 || !strings.HasSuffix(held[0], "/vms/box/disk") {
		t.Fatalf("a file held on the dead mount: %v, %v", held, err)
	}
	if held, err := HeldOnLostMount(holdOpen(t, path), v2.Root()); err != nil || len(held) != 0 {
		t.Fatalf("a file held on the new mount: %v, %v", held, err)
	}
}

// TestHeldAcrossLazyUnmount: an operator detached the mount (umount -l)
// while a process held a file on it; the old juicefs still serves the
// detached mount. The next Open mounts anew, and the holder is reported
// as holding its file on a lost mount.
func TestHeldAcrossLazyUnmount(t *testing.T) {
	needIntegration(t)
	cfg := Config{StateDir: t.TempDir()}
	v := openVolume(t, cfg)
	path, _ := diskWithData(t, v, "box")
	holder := holdOpen(t, path)
	svc, sup, err := v.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killMount(t, svc, sup) })
	v.Close()
	if err := unix.Unmount(v.Root(), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}

	v2 := openVolume(t, cfg)
	if svc2, _, err := v2.MountPIDs(); err != nil || svc2 == svc {
		t.Fatalf("not mounted anew: service pid %d (before %d), %v", svc2, svc, err)
	}
	held, err := HeldOnLostMount(holder, v2.Root())
	if err != nil || len(held) != 1 || !strings.HasSuffix(held[0], "/vms/box/disk") {
		t.Fatalf("a file held on the detached mount: %v, %v", held, err)
	}
	if held, err := HeldOnLostMount(holdOpen(t, path), v2.Root()); err != nil || len(held) != 0 {
		t.Fatalf("a file held on the new mount: %v, %v", held, err)
	}
	// A process that is gone holds nothing.
	if held, err := HeldOnLostMount(1<<22+1, v2.Root()); err != nil || len(held) != 0 {
		t.Fatalf("no such process: %v, %v", held, err)
	}
}

// TestMountLogsFUSEProcess: the pid den logs for a mount is the process
// serving FUSE (the service process the mount names), not juicefs's
// supervisor; a mount adopted by the next daemon is logged likewise, and
// its processes are found by their command lines (which juicefs
// rewrites into one string).
func TestMountLogsFUSEProcess(t *testing.T) {
	needIntegration(t)
	logs := captureLog(t)
	cfg := Config{StateDir: t.TempDir()}
	v := openVolume(t, cfg)
	svc, sup, err := v.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`msg="storage: mounted" .*pid=` + strconv.Itoa(svc) + ` supervisor=` + strconv.Itoa(sup) + ` `)
	if !want.MatchString(logs.String()) {
		t.Errorf("mount log, want pid=%d (service) supervisor=%d:\n%s", svc, sup, logs)
	}
	v.Close()
	v2 := openVolume(t, cfg)
	want = regexp.MustCompile(`msg="storage: adopted mount" .*pid=` + strconv.Itoa(svc) + ` supervisor=` + strconv.Itoa(sup))
	if !want.MatchString(logs.String()) {
		t.Errorf("adopt log, want pid=%d supervisor=%d:\n%s", svc, sup, logs)
	}
	pids := v2.mountPIDs()
	slices.Sort(pids)
	if exp := []int{min(svc, sup), max(svc, sup)}; !slices.Equal(pids, exp) {
		t.Fatalf("juicefs processes of the adopted mount: %v, want %v", pids, exp)
	}
}

func TestIsJuiceFSMount(t *testing.T) {
	cache, mp := "/var/lib/den/juicefs/cache", "/var/lib/den/juicefs/mnt"
	for _, c := range []struct {
		cmdline string
		want    bool
	}{
		{"/usr/bin/juicefs\x00--no-color\x00mount\x00--cache-dir\x00" + cache + "\x00sqlite3:///m.db\x00" + mp + "\x00", true},
		// juicefs rewrites its argv so: one string, cut short.
		{"/work/bin/juicefs --no-color mount --cache-dir " + cache + " --log /var/lib/den/juicefs/juicefs-den.log sqlite3:///var/li\x00\x00\x00", true},
		{"/work/bin/juicefs --no-color mount --cache-dir /c sqlite3:///m.db " + mp + "\x00", true},
		{"/work/bin/juicefs --no-color mount --cache-dir " + cache + "2 sqlite3:///m.db /other" + mp + "\x00", false},
		{"/work/bin/juicefs --no-color mount sqlite3:///m.db " + mp + "2\x00", false},
		{"/usr/bin/juicefs\x00format\x00--cache-dir\x00" + cache + "\x00sqlite3:///m.db\x00" + mp + "\x00", false},
		{"/usr/bin/sleep\x00mount\x00--cache-dir\x00" + cache + "\x00" + mp + "\x00", false},
	} {
		if got := isJuiceFSMount([]byte(c.cmdline), cache, mp); got != c.want {
			t.Errorf("%q: %v, want %v", c.cmdline, got, c.want)
		}
	}
}
