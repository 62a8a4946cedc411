package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// reboot does to den what a host reboot does after the shutdown path
// ran: the daemon, every VMM of the state dir and the JuiceFS mount are
// killed (-9), the dead mount is gone, and so is guest RAM (tmpfs does
// not survive a reboot); then the daemon starts again.
func (d *daemon) reboot(t *testing.T) {
	t.Helper()
	d.kill()
	mounts := juicefsMountPIDs(t, d.state)
	killUnder(d.state)
	for _, pid := range mounts {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	left := 0
	if !eventually(30*time.Second, func() bool {
		left = 0
		for _, pid := range mounts {
			if syscall.Kill(pid, 0) == nil {
				left++
			}
		}
		ents, _ := os.ReadDir(filepath.Join(d.state, "run"))
		for _, e := range ents {
			left += len(d.vmmPIDs(e.Name()))
		}
		return left == 0
	}) {
		t.Fatalf("%d processes outlived the simulated reboot", left)
	}
	_ = unix.Unmount(filepath.Join(d.state, "juicefs", "mnt"), unix.MNT_DETACH)
	// Guest RAM is on den's tmpfs, which a reboot empties.
	_ = unix.Unmount(filepath.Join(d.state, "ram"), unix.MNT_DETACH)
	d.start()
}

// hostSummary is the part of `den sleep --all --json` the test reads.
type hostSummary struct {
	VMs []struct {
		Name   string `json:"name"`
		OK     bool   `json:"ok"`
		State  string `json:"state"`
		Reason string `json:"reason"`
		Error  string `json:"error"`
	} `json:"vms"`
	Failed []string `json:"failed"`
}

// TestReboot: running VMs with background processes go through the
// shutdown path (den sleep --all --shutdown, as den-shutdown.service runs
// it), then a reboot (daemon, VMMs and JuiceFS mount killed): after the
// daemon starts, each VM is running again by itself with its processes
// and files. One VM's VMM hangs (SIGSTOP) so that it cannot sleep in
// time: den stops it and records it stopped with what was lost and its
// last checkpoint, which the reboot does not change, and it is not woken.
func TestReboot(t *testing.T) {
	d := startDaemon(t)
	sleepers := []string{"r1", "r2", "r3"}
	for _, n := range append(sleepers, "hung") {
		d.must("create", n, "--memory", "256M", "--idle-timeout", "0")
		d.must("exec", n, "--", "sh", "-c", startWork)
	}
	d.must("checkpoint", "hung", "-m", "before the shutdown")
	for _, pid := range d.vmmPIDs("hung") {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	out, err := d.run("sleep", "--all", "--shutdown", "--timeout", "40s", "--json")
	took := time.Since(start)
	t.Logf("shutdown path took %s", took.Round(time.Millisecond))
	if exitCode(err) != 1 || !strings.Contains(stderrOf(err), "1 of 4 vms not asleep: hung") {
		t.Fatalf("den sleep --all --shutdown with a hung vmm: exit %d, %v\n%s", exitCode(err), err, out)
	}
	if took > 50*time.Second {
		t.Fatalf("the shutdown path took %s, bound 40s", took)
	}
	var sum hostSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if len(sum.VMs) != 4 || len(sum.Failed) != 1 || sum.Failed[0] != "hung" {
		t.Fatalf("summary: %+v", sum)
	}
	for _, v := range sum.VMs {
		if v.Name != "hung" && (!v.OK || v.State != "sleeping") {
			t.Fatalf("%s after the shutdown path: %+v", v.Name, v)
		}
	}
	for _, n := range append(sleepers, "hung") {
		if pids := d.vmmPIDs(n); len(pids) != 0 {
			t.Fatalf("%s still has vmm processes %v after the shutdown path", n, pids)
		}
	}
	// Nothing wakes a VM between the shutdown path and the kill.
	if _, err := d.run("exec", "r1", "--", "true"); err == nil || !strings.Contains(stderrOf(err), "shutting down") {
		t.Fatalf("exec after the shutdown path: %v", err)
	}
	lost := func(when string) {
		t.Helper()
		vm := d.info("hung")
		for _, want := range []string{"host shut down before it could sleep", "processes are lost", "last checkpoint cp-1, taken"} {
			if vm.State != "stopped" || !strings.Contains(vm.Reason, want) {
				t.Fatalf("%s: hung is %s (%s), want stopped with %q", when, vm.State, vm.Reason, want)
			}
		}
		if strings.Contains(vm.Reason, "wakes it") {
			t.Fatalf("%s: hung claims it will be woken: %s", when, vm.Reason)
		}
	}
	lost("after the shutdown path")

	d.reboot(t)
	for _, n := range sleepers {
		var vm vmJSON
		if !eventually(4*time.Minute, func() bool { vm = d.info(n); return vm.State == "running" }) {
			t.Fatalf("%s not woken after the reboot: %s (%s)", n, vm.State, vm.Reason)
		}
	}
	for _, n := range sleepers {
		if out := d.must("exec", n, "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
			t.Fatalf("%s after the reboot: %q (want its file and its process)", n, out)
		}
	}
	log, _ := os.ReadFile(d.logPath)
	if n := bytes.Count(log, []byte("boot wake: vm woken")); n != len(sleepers) {
		t.Fatalf("daemon log has %d boot wakes, want %d", n, len(sleepers))
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "boot wake") || strings.Contains(line, "host shutdown") {
			t.Log(line)
		}
	}
	lost("after the reboot")
	// Its disk is there; its processes are not.
	if out := d.must("exec", "hung", "--", "sh", "-c", checkWork); out != "v1\ndead\n" {
		t.Fatalf("hung after the reboot: %q", out)
	}
}
