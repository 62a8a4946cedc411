package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

type checkpointJSON struct {
	ID     string `json:"id"`
	Parent string `json:"parent"`
	Kind   string `json:"kind"`
	Head   bool   `json:"head"`
}

func (d *daemon) checkpoints(name string) []checkpointJSON {
	d.t.Helper()
	var cps []checkpointJSON
	if err := json.Unmarshal([]byte(d.must("checkpoints", name, "--json")), &cps); err != nil {
		d.t.Fatal(err)
	}
	return cps
}

// startWork writes a file and starts a background process whose pid is
// kept in tmpfs: state that a memory checkpoint must bring back.
const startWork = `echo v1 > /root/file; sync; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/pid`
const checkWork = `cat /root/file; kill -0 $(cat /tmp/pid) && echo alive || echo dead`

func TestCheckpointRestoreFork(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "256M")
	d.must("exec", "box", "--", "sh", "-c", startWork)
	id := strings.TrimSpace(d.must("checkpoint", "box", "-m", "v1 and a sleeper"))
	if id != "cp-1" {
		t.Fatalf("first checkpoint id %q", id)
	}
	d.must("exec", "box", "--", "sh", "-c", "echo v2 > /root/file; kill $(cat /tmp/pid)")
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v2\ndead\n" {
		t.Fatalf("before restore: %q", out)
	}

	t.Run("restore", func(t *testing.T) {
		d.must("restore", "box", "cp-1")
		if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
			t.Fatalf("after restore: %q", out)
		}
		// The state before the restore was saved as cp-2, child of cp-1;
		// the VM's head is cp-1 again.
		cps := d.checkpoints("box")
		if len(cps) != 2 || cps[1].ID != "cp-2" || cps[1].Parent != "cp-1" || !cps[0].Head {
			t.Fatalf("lineage: %+v", cps)
		}
		d.must("restore", "box", "cp-2", "--no-save")
		if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v2\ndead\n" {
			t.Fatalf("after restore to cp-2: %q", out)
		}
	})

	t.Run("activity record", func(t *testing.T) { testActivity(t, d) })

	t.Run("fork twice", func(t *testing.T) {
		d.must("fork", "box@cp-1", "f1")
		d.must("fork", "box@cp-1", "f2")
		seen := map[string]string{}
		for _, vm := range []string{"f1", "f2"} {
			out := d.must("exec", vm, "--", "sh", "-c", "hostname; "+checkWork+"; cat /proc/sys/kernel/random/uuid /proc/sys/kernel/random/uuid")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 5 || lines[0] != vm || lines[1] != "v1" || lines[2] != "alive" {
				t.Fatalf("fork %s: %q", vm, out)
			}
			for _, u := range lines[3:] {
				if other, dup := seen[u]; dup {
					t.Fatalf("forks share random state: uuid %s in %s and %s", u, other, vm)
				}
				seen[u] = vm
			}
		}
	})

	t.Run("disk-only checkpoint and delete", func(t *testing.T) {
		id := strings.TrimSpace(d.must("checkpoint", "box", "--disk-only", "-m", "disk"))
		cps := d.checkpoints("box")
		last := cps[len(cps)-1]
		if last.ID != id || last.Kind != "disk-only" {
			t.Fatalf("disk-only checkpoint: %+v", cps)
		}
		d.must("exec", "box", "--", "sh", "-c", "echo v3 > /root/file; sync")
		d.must("restore", "box", id, "--no-save")
		// A disk-only restore boots: the file is back, processes are not.
		if out := d.must("exec", "box", "--", "cat", "/root/file"); out != "v2\n" {
			t.Fatalf("after disk-only restore: %q", out)
		}
		d.must("checkpoint", "rm", "box", "cp-2")
		for _, cp := range d.checkpoints("box") {
			if cp.ID == "cp-2" {
				t.Fatal("cp-2 still listed after rm")
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"restore", "box", "cp-99"}, `has no checkpoint cp-99`},
			{[]string{"restore", "box", "latest"}, `bad checkpoint id "latest"`},
			{[]string{"restore", "ghost", "cp-1"}, `no vm named "ghost"`},
			{[]string{"fork", "box@cp-99", "f3"}, `has no checkpoint cp-99`},
			{[]string{"fork", "box@cp-1", "f1"}, `exists`},
			{[]string{"checkpoint", "rm", "box", "cp-99"}, `has no checkpoint cp-99`},
		} {
			_, err := d.run(c.args...)
			if exitCode(err) == 0 || !strings.Contains(stderrOf(err), c.want) {
				t.Errorf("den %s: exit %d, %q; want %q", strings.Join(c.args, " "), exitCode(err), stderrOf(err), c.want)
			}
		}
		// A restore while an exec runs is refused with a clear error.
		long := exec.Command(d.den, "exec", "box", "--", "sleep", "30")
		long.Env = append(long.Env, "DEN_SOCKET="+d.socket)
		if err := long.Start(); err != nil {
			t.Fatal(err)
		}
		defer long.Process.Kill()
		time.Sleep(time.Second)
		_, err := d.run("restore", "box", "cp-1")
		if !strings.Contains(stderrOf(err), "session(s) open") {
			t.Fatalf("restore during an exec: %v", err)
		}
	})

	t.Run("retention", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			d.must("checkpoint", "box", "--disk-only", "--keep", "2")
		}
		cps := d.checkpoints("box")
		if len(cps) != 2 {
			t.Fatalf("--keep 2 left %d checkpoints: %+v", len(cps), cps)
		}
		var head bool
		for _, cp := range cps {
			head = head || cp.Head
		}
		if !head {
			t.Fatalf("retention dropped the head: %+v", cps)
		}
	})
}

func TestIdleSleepAndWake(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "nap", "--memory", "256M", "--idle-timeout", "3s")
	d.must("exec", "nap", "--", "sh", "-c", startWork)
	pid := d.info("nap").PID
	deadline := time.Now().Add(90 * time.Second)
	for d.info("nap").State != "sleeping" {
		if time.Now().After(deadline) {
			t.Fatalf("vm did not fall asleep: %+v", d.info("nap"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// A sleep records the VM as sleeping once its snapshot is whole, then
	// stops the VMM (sleep.go): the process goes a moment after the state
	// says sleeping.
	if !eventually(30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
		t.Fatalf("vmm %d still runs 30 s after the vm fell asleep", pid)
	}
	// A checkpoint of a sleeping VM comes from its suspend slot.
	id := strings.TrimSpace(d.must("checkpoint", "nap"))
	if cps := d.checkpoints("nap"); cps[0].ID != id || cps[0].Kind != "memory+disk" {
		t.Fatalf("checkpoint while sleeping: %+v", cps)
	}
	if d.info("nap").State != "sleeping" {
		t.Fatal("checkpoint woke the vm")
	}
	// Reaching it wakes it with everything in place.
	if out := d.must("exec", "nap", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after wake: %q", out)
	}
	if d.info("nap").State != "running" {
		t.Fatal("not running after exec")
	}
	// A keep-awake lease taken inside the guest keeps it up past its idle
	// timeout; once released, the VM falls asleep again.
	d.must("exec", "nap", "--", "den-agent", "hold", "--name", "build")
	time.Sleep(8 * time.Second) // well past the 3s timeout and 1s checks
	if vm := d.info("nap"); vm.State != "running" {
		t.Fatalf("vm with a lease held: %+v", vm)
	}
	d.must("exec", "nap", "--", "den-agent", "release", "--name", "build")
	deadline = time.Now().Add(90 * time.Second)
	for d.info("nap").State != "sleeping" {
		if time.Now().After(deadline) {
			t.Fatalf("vm did not sleep after the lease was released: %+v", d.info("nap"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Explicit sleep and wake.
	d.must("wake", "nap")
	d.must("sleep", "nap")
	d.must("wake", "nap")
	if out := d.must("exec", "nap", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after sleep and wake: %q", out)
	}
}

func TestCrashDuringCheckpointAndRestore(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	d.must("exec", "box", "--", "sh", "-c", startWork)
	d.must("checkpoint", "box", "-m", "good")

	// The daemon dies between the memory snapshot and the disk clone.
	d.kill()
	d.env = []string{"DEN_CRASHPOINT=checkpoint-after-snapshot"}
	d.start()
	if _, err := d.run("checkpoint", "box"); err == nil {
		t.Fatal("checkpoint succeeded through a crash point")
	} else {
		t.Logf("checkpoint through the crash point: %v: %s", err, stderrOf(err)) // says why if the daemon lives on
	}
	d.waitExit()
	d.env = nil
	d.start()
	if vm := d.info("box"); vm.State != "running" {
		t.Fatalf("after a crash mid-checkpoint: %+v", vm)
	}
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("vm after a crash mid-checkpoint: %q", out)
	}
	if cps := d.checkpoints("box"); len(cps) != 1 || cps[0].ID != "cp-1" {
		t.Fatalf("checkpoints after a crash mid-checkpoint: %+v", cps)
	}

	// The daemon dies in the middle of a restore: crashRestore writes
	// value to the file, then restores cp-1 through a crash at point.
	crashRestore := func(value, point string) {
		t.Helper()
		d.must("exec", "box", "--", "sh", "-c", "echo "+value+" > /root/file; sync; kill $(cat /tmp/pid)")
		d.kill()
		d.env = []string{"DEN_CRASHPOINT=" + point}
		d.start()
		if _, err := d.run("restore", "box", "cp-1", "--no-save"); err == nil {
			t.Fatalf("restore succeeded through crash point %s", point)
		}
		d.waitExit()
		d.env = nil
		d.start()
	}
	// After the disk was replaced, before memory. Reaching the VM
	// finishes the interrupted restore.
	crashRestore("v2", "restore-after-disk")
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("vm after a crash mid-restore: %q", out)
	}
	d.must("restore", "box", "cp-1", "--no-save")
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("restore after the crash: %q", out)
	}

	// With the VMM stopped, the checkpoint's disk being staged beside the
	// VM's and not yet in place. The start removes a staged disk;
	// reaching the VM finishes the restore with a clone of its own.
	crashRestore("v3", "restore-after-stop")
	if _, err := os.Stat(d.volumePath("vms", "box", "disk-restoring")); !os.IsNotExist(err) {
		t.Fatalf("a staged disk outlived the restart: %v", err)
	}
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("vm after a crash before the staged disk was in place: %q", out)
	}
}
