package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// crashAt runs a den verb with the daemon set to kill itself (-9) at a
// named step, then starts it again as after a crash.
func (d *daemon) crashAt(point string, args ...string) {
	d.t.Helper()
	d.kill()
	d.env = []string{"DEN_CRASHPOINT=" + point}
	d.start()
	if out, err := d.run(args...); err == nil {
		d.t.Fatalf("den %s went through the crash point %s: %q", strings.Join(args, " "), point, out)
	}
	d.waitExit()
	d.env = nil
	d.start()
}

// vmmsOf counts the QEMU processes whose command line names a VM's
// runtime dir.
func (d *daemon) vmmsOf(name string) int { return len(d.vmmPIDs(name)) }

// TestCrashAtEveryStep kills the daemon (-9) at each step of create,
// fork, checkpoint, sleep, wake, restore and rm. After each restart every
// VM is in a state that says what happened, runs on one VMM at most,
// keeps what it had synced, and every checkpoint listed restores.
func TestCrashAtEveryStep(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	d.must("exec", "box", "--", "sh", "-c", startWork)
	d.must("checkpoint", "box", "-m", "good")
	alive := func(step string) {
		t.Helper()
		// Running, asleep, or stopped with the reason (a restore to
		// finish when next reached): never a state without a story.
		if vm := d.info("box"); vm.State != "running" && vm.State != "sleeping" && (vm.State != "stopped" || vm.Reason == "") {
			t.Fatalf("%s: box is %s (%s)", step, vm.State, vm.Reason)
		}
		if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
			t.Fatalf("%s: box holds %q", step, out)
		}
		if n := d.vmmsOf("box"); n != 1 {
			t.Fatalf("%s: box has %d vmm processes", step, n)
		}
	}
	gone := func(step, name string) {
		t.Helper()
		if _, err := d.run("info", name); !strings.Contains(stderrOf(err), "no vm named") {
			t.Fatalf("%s: %s after the crash: %v", step, name, err)
		}
		if n := d.vmmsOf(name); n != 0 {
			t.Fatalf("%s: %s has %d vmm processes left", step, name, n)
		}
		if _, err := os.Stat(filepath.Join(d.state, "juicefs", "mnt", "vms", name)); err == nil {
			t.Fatalf("%s: the files of %s are left", step, name)
		}
	}
	steps := []struct {
		point string
		args  []string
		check func(step string)
	}{
		{"checkpoint-after-snapshot", []string{"checkpoint", "box"}, alive},
		{"checkpoint-before-commit", []string{"checkpoint", "box"}, alive},
		{"sleep-after-pause", []string{"sleep", "box"}, alive},
		{"sleep-after-snapshot", []string{"sleep", "box"}, alive},
		{"sleep-after-record", []string{"sleep", "box"}, alive},
		{"restore-after-stop", []string{"restore", "box", "cp-1", "--no-save"}, alive},
		{"restore-after-disk", []string{"restore", "box", "cp-1", "--no-save"}, alive},
		{"bringup-after-clone", []string{"create", "newbie", "--memory", "256M"}, func(s string) { gone(s, "newbie") }},
		{"bringup-before-commit", []string{"fork", "box@cp-1", "forky"}, func(s string) { gone(s, "forky") }},
	}
	for _, s := range steps {
		d.crashAt(s.point, s.args...)
		s.check(s.point)
	}
	// wake: the restored VMM is running when the daemon dies, the record
	// still says sleeping.
	d.must("sleep", "box")
	d.crashAt("wake-after-restore", "wake", "box")
	alive("wake-after-restore")
	// Every checkpoint listed restores.
	for _, cp := range d.checkpoints("box") {
		d.must("restore", "box", cp.ID, "--no-save")
		if out := d.must("exec", "box", "--", "cat", "/root/file"); out != "v1\n" {
			t.Fatalf("restore of %s: %q", cp.ID, out)
		}
	}
	if cps := d.checkpoints("box"); len(cps) != 1 {
		t.Fatalf("checkpoints after crashes mid-checkpoint: %+v", cps)
	}
	d.crashAt("rm-after-mark", "rm", "--force", "box")
	gone("rm-after-mark", "box")
	t.Log("crash suite: 12 crash points survived")
}
