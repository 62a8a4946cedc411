package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/image"
)

// volumeMount is the mount point of a test daemon's embedded volume.
func (d *daemon) volumeMount() string { return filepath.Join(d.state, "juicefs", "mnt") }

// logHas says whether the daemon's log holds s.
func (d *daemon) logHas(s string) bool {
	b, _ := os.ReadFile(d.logPath)
	return strings.Contains(string(b), s)
}

// stoppedOffLostMount checks that a VM whose VMM held its disk on a
// mount that died while no daemon ran was stopped, not adopted, with a
// reason that says so, and that its QEMU is gone; then that it boots
// from its disk with the file synced before.
func stoppedOffLostMount(t *testing.T, d *daemon, name string) {
	t.Helper()
	vm := d.info(name)
	if vm.State != "stopped" || !strings.Contains(vm.Reason, "storage volume lost while den was not running") ||
		!strings.Contains(vm.Reason, "/vms/"+name+"/") || !strings.Contains(vm.Reason, "last checkpoint, cp-1") {
		t.Fatalf("a vm whose disk was on the lost mount, after the restart: %+v", vm)
	}
	t.Logf("%s: %s: %s", name, vm.State, vm.Reason)
	if !eventually(10*time.Second, func() bool { return len(d.vmmPIDs(name)) == 0 }) {
		t.Fatalf("its qemu still runs: %v", d.vmmPIDs(name))
	}
	if out := d.must("exec", name, "--", "cat", "/root/kept"); out != "kept\n" {
		t.Fatalf("file synced before the mount died: %q", out)
	}
	if vm := d.info(name); vm.State != "running" {
		t.Fatalf("after the next use: %+v", vm)
	}
}

// TestRestartOverDeadMount: the daemon and the volume's juicefs processes
// are killed (-9) with a VM running; the mount point is a dead FUSE
// mount (ENOTCONN). The next daemon starts (it unmounts the dead mount
// lazily, says so, and mounts again), and the VM, whose QEMU still
// holds its disk on the dead mount, is stopped with the reason.
func TestRestartOverDeadMount(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "m", "--memory", "256M", "--idle-timeout", "0")
	d.must("exec", "m", "--", "sh", "-c", "echo kept > /root/kept; sync")
	d.must("checkpoint", "m")
	mounts := juicefsMountPIDs(t, d.state)
	d.kill()
	for _, pid := range mounts {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if !eventually(10*time.Second, func() bool {
		_, err = os.Stat(d.volumeMount())
		return errors.Is(err, syscall.ENOTCONN)
	}) {
		t.Fatalf("the mount point after its juicefs was killed: %v, want ENOTCONN", err)
	}

	d.start()
	if !d.logHas("dead mount at the mount point") {
		t.Error("no log line about the dead mount")
	}
	stoppedOffLostMount(t, d, "m")
}

// TestAdoptAfterLazyUnmount: with the daemon down and a VM running, an
// operator detaches the volume (umount -l). The next daemon mounts the
// volume anew; the VM's QEMU holds its disk on the detached mount, so
// the VM is stopped with the reason, not adopted as running.
func TestAdoptAfterLazyUnmount(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "m", "--memory", "256M", "--idle-timeout", "0")
	d.must("exec", "m", "--", "sh", "-c", "echo kept > /root/kept; sync")
	d.must("checkpoint", "m")
	old := juicefsMountPIDs(t, d.state)
	t.Cleanup(func() {
		for _, pid := range old {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	d.kill()
	if err := syscall.Unmount(d.volumeMount(), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	d.start()
	stoppedOffLostMount(t, d, "m")
}

// TestRefusedStartLeavesNothingMounted: a daemon that refuses to start
// exits 1 with one line and leaves no mount (volume, guest RAM tmpfs)
// and no juicefs process behind: refused before it mounts anything (a
// state dir the VMM user cannot pass through), or after (the socket is
// another daemon's).
func TestRefusedStartLeavesNothingMounted(t *testing.T) {
	den, images := requireHost(t)
	refuse := func(dir, socket, want string) {
		t.Helper()
		state := filepath.Join(dir, "state")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, den, "daemon", "--state-dir", state, "--socket", socket,
			"--images", images.Path(), "--default-image", image.Minimal, "--ssh-listen", "127.0.0.1:0",
			"--memory-pressure", "0", "--net", "user")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), want) {
			t.Fatalf("daemon on %s: %v, want exit 1 with %q:\n%s", state, err, want, out)
		}
		t.Logf("refused: %s", lastLine(string(out)))
		mounts, _ := os.ReadFile("/proc/mounts")
		for _, l := range strings.Split(string(mounts), "\n") {
			if strings.Contains(l, state) {
				t.Errorf("left mounted: %s", l)
			}
		}
		if pids := pidsWhere(func(cmdline []byte) bool {
			return strings.Contains(string(cmdline), "juicefs") && strings.Contains(string(cmdline), state+"/")
		}); len(pids) > 0 {
			t.Errorf("juicefs processes left: %v", pids)
		}
	}
	cleanDir := func(dir string) {
		t.Cleanup(func() {
			mounts, _ := os.ReadFile("/proc/mounts")
			for _, l := range strings.Split(string(mounts), "\n") {
				if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
					_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
				}
			}
			killJuiceFSUnder(dir)
			if !t.Failed() {
				_ = os.RemoveAll(dir)
			}
		})
	}

	// A state dir the VMM user cannot pass through.
	closed, err := os.MkdirTemp("/tmp", "den-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	cleanDir(closed)
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	refuse(closed, filepath.Join(closed, "den.sock"), "cannot pass through")

	// A socket another daemon serves: refused after the volume is up.
	d := startDaemon(t)
	other, err := os.MkdirTemp("/tmp", "den-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	cleanDir(other)
	if err := os.Chmod(other, 0o711); err != nil {
		t.Fatal(err)
	}
	refuse(other, d.socket, "another den daemon is listening")
	d.must("ls")
}

// killJuiceFSUnder kills the juicefs processes whose command line
// mentions dir.
func killJuiceFSUnder(dir string) {
	for _, pid := range pidsWhere(func(cmdline []byte) bool {
		return strings.Contains(string(cmdline), "juicefs") && strings.Contains(string(cmdline), dir+"/")
	}) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
