package e2e

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/checkpoint"
)

// refusedLine is what den says to work asked of it once a host shutdown
// began.
const refusedLine = "the host is shutting down"

type runResult struct {
	out string
	err error
}

// TestShutdownRefusesExecs: execs fired at a sleeping and at a running
// VM while `den sleep --all --shutdown` runs are refused with one line
// (the running VM's VMM is stopped, SIGSTOP, so that the shutdown is
// still under way), and so are execs after it; the sleeping VM is not
// woken. After the emulated reboot the VM the shutdown put to sleep is
// woken by den with its process, and the other wakes when used, with
// its process.
func TestShutdownRefusesExecs(t *testing.T) {
	d := startDaemon(t)
	for _, n := range []string{"run", "nap"} {
		d.must("create", n, "--memory", "256M", "--idle-timeout", "0")
		d.must("exec", n, "--", "sh", "-c", startWork)
	}
	d.must("sleep", "nap")
	stopped := d.vmmPIDs("run")
	if len(stopped) == 0 {
		t.Fatal("no vmm for run")
	}
	cont := func() {
		for _, pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer cont()
	for _, pid := range stopped {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	shutdown := make(chan runResult, 1)
	go func() {
		out, err := d.run("sleep", "--all", "--shutdown", "--timeout", "3m", "--json")
		shutdown <- runResult{out, err}
	}()
	if !eventually(time.Minute, func() bool {
		log, _ := os.ReadFile(d.logPath)
		return bytes.Contains(log, []byte("host shutting down"))
	}) {
		t.Fatal("the shutdown never began")
	}
	execs := map[string]chan runResult{}
	for _, n := range []string{"nap", "run"} {
		ch := make(chan runResult, 1)
		execs[n] = ch
		go func() {
			out, err := d.run("exec", n, "--", "echo", "ran")
			ch <- runResult{out, err}
		}()
	}
	refused := func(what string, r runResult) {
		t.Helper()
		if r.err == nil || !strings.Contains(stderrOf(r.err), refusedLine) {
			t.Errorf("%s: %q, %v; want it refused (%s)", what, r.out, r.err, refusedLine)
		}
	}
	// The exec at the sleeping VM first: the shutdown waits for run's
	// VMM, stopped until then.
	select {
	case r := <-execs["nap"]:
		refused("exec at the sleeping vm during the shutdown", r)
	case <-time.After(3 * time.Minute):
		t.Error("the exec at the sleeping vm during the shutdown did not end in 3 minutes")
	}
	cont()
	refused("exec at the running vm during the shutdown", <-execs["run"])
	if r := <-shutdown; r.err != nil {
		t.Fatalf("den sleep --all --shutdown: %v\n%s", r.err, r.out)
	}
	for _, n := range []string{"nap", "run"} {
		out, err := d.run("exec", n, "--", "echo", "ran")
		refused("exec at "+n+" after the shutdown", runResult{out, err})
		if pids := d.vmmPIDs(n); len(pids) != 0 {
			t.Errorf("%s has vmm processes %v after the shutdown", n, pids)
		}
	}
	if vm := d.info("nap"); vm.State != "sleeping" || strings.Contains(vm.Reason, "wakes it") {
		t.Errorf("nap, asleep before the shutdown: %s (%s)", vm.State, vm.Reason)
	}
	if vm := d.info("run"); vm.State != "sleeping" || !strings.Contains(vm.Reason, "den wakes it when it next starts") {
		t.Errorf("run after the shutdown: %s (%s)", vm.State, vm.Reason)
	}
	if t.Failed() {
		t.FailNow()
	}

	d.reboot(t)
	var vm vmJSON
	if !eventually(4*time.Minute, func() bool { vm = d.info("run"); return vm.State == "running" }) {
		t.Fatalf("run not woken after the reboot: %s (%s)", vm.State, vm.Reason)
	}
	for _, n := range []string{"run", "nap"} {
		if out := d.must("exec", n, "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
			t.Errorf("%s after the reboot: %q (want its file and its process)", n, out)
		}
	}
}

// TestBootWakeRefusesDamagedMemory: the shutdown returns once the
// memory it wrote has its digests; a slot damaged after the shutdown is
// then refused by the boot wake, which leaves the VM asleep with the
// reason in its record, and so is every wake until the memory is whole
// again.
func TestBootWakeRefusesDamagedMemory(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "128M", "--idle-timeout", "0")
	d.must("exec", "box", "--", "sh", "-c", startWork)
	d.must("sleep", "--all", "--shutdown", "--json")
	slot := d.volumePath("vms", "box", "suspend")
	if !checkpoint.Sealed(slot) {
		t.Fatal("the shutdown returned before the digests of the memory it wrote")
	}
	off, flip, want := d.keptExtent(t, slot)
	flip()
	d.flipLocalMemory(t, "box", "suspend-", off)

	d.reboot(t)
	if !eventually(4*time.Minute, func() bool {
		log, _ := os.ReadFile(d.logPath)
		return bytes.Contains(log, []byte("boot wake done"))
	}) {
		t.Fatal("the boot wake did not end")
	}
	vm := d.info("box")
	if vm.State != "sleeping" || !strings.Contains(vm.Reason, "den did not wake it when it started") ||
		!strings.Contains(vm.Reason, "is damaged: "+want) {
		t.Fatalf("box after the boot wake: %s (%s)", vm.State, vm.Reason)
	}
	t.Logf("box after the boot wake: %s (%s)", vm.State, vm.Reason)
	if _, err := d.run("exec", "box", "--", "true"); err == nil || !strings.Contains(stderrOf(err), "is damaged") {
		t.Fatalf("exec into the damaged vm: %v", err)
	}
	// Whole again, it wakes with its process.
	flip()
	if out := d.must("exec", "box", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("box with its memory whole again: %q", out)
	}
}
