package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// memoryJSON is the memory part of `den info --json` (the daemon).
type memoryJSON struct {
	Budget    int64 `json:"budget_bytes"`
	Committed int64 `json:"committed_bytes"`
	Free      int64 `json:"free_bytes"`
	Running   int   `json:"running"`
}

func (d *daemon) memory() memoryJSON {
	d.t.Helper()
	var info struct {
		Memory *memoryJSON `json:"memory"`
	}
	if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil {
		d.t.Fatal(err)
	}
	if info.Memory == nil {
		d.t.Fatal("den info --json has no memory")
	}
	return *info.Memory
}

// wantStates checks the states of VMs: name -> state.
func (d *daemon) wantStates(want map[string]string) {
	d.t.Helper()
	for name, state := range want {
		if vm := d.info(name); vm.State != state {
			d.t.Fatalf("vm %s is %s (%s), want %s", name, vm.State, vm.Reason, state)
		}
	}
}

// waitState waits (bounded) until a VM is in state.
func (d *daemon) waitState(name, state string, within time.Duration) {
	d.t.Helper()
	var vm vmJSON
	if !eventually(within, func() bool { vm = d.info(name); return vm.State == state }) {
		d.t.Fatalf("vm %s is %s (%s) after %s, want %s", name, vm.State, vm.Reason, within, state)
	}
}

// TestAdmission: with a budget that holds two small VMs, a third create
// puts the least recently active idle one to sleep (it wakes later with
// its processes, and another sleeps to make room); with both running VMs
// busy (a keep-awake lease, an open exec session) a create is refused
// with a line naming them, and nothing of it is left.
func TestAdmission(t *testing.T) {
	// 128 MiB guests count 256 MiB each with the VMM: two fit in 640M,
	// three do not. The idle monitor is kept from its passes (the last
	// --idle-check wins): under TCG a guest that just ran something is
	// busy on its CPU for a few seconds, which counts as activity, and
	// the order of "least recently active" is then the test's, not the
	// CPU's.
	d := startDaemonIn(t, func(string) []string {
		return []string{"--memory-budget", "640M", "--vmm-overhead", "128M", "--idle-check", "1h"}
	})
	create := func(name string) { d.must("create", name, "--memory", "128M", "--idle-timeout", "1h") }
	create("a")
	create("b")
	d.must("exec", "a", "--", "sh", "-c", startWork)
	d.must("exec", "b", "--", "true") // a is now the least recently active
	if m := d.memory(); m.Budget != 640<<20 || m.Committed != 512<<20 || m.Free != 128<<20 || m.Running != 2 {
		t.Fatalf("memory with two vms: %+v", m)
	}

	create("c")
	d.wantStates(map[string]string{"a": "sleeping", "b": "running", "c": "running"})
	if m := d.memory(); m.Committed != 512<<20 || m.Running != 2 {
		t.Fatalf("memory after the third create: %+v", m)
	}
	if log, _ := os.ReadFile(d.logPath); !strings.Contains(string(log), `msg="den: putting vm to sleep to free memory" vm=a reason="vm \"c\" needs 256 MiB, 128 MiB free in the memory budget"`) {
		t.Fatalf("the sleep of a is not logged with its reason:\n%s", log)
	}

	// a wakes with its processes; b, now the least recently active,
	// sleeps to make room.
	if out := d.must("exec", "a", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("a after its sleep for memory: %q", out)
	}
	d.wantStates(map[string]string{"a": "running", "b": "sleeping", "c": "running"})

	// Both running VMs busy: a keep-awake lease in a, an exec session
	// open in c.
	d.must("exec", "a", "--", "den-agent", "hold", "--name", "admission")
	long := exec.Command(d.den, "exec", "c", "--", "sleep", "601")
	long.Env = append(os.Environ(), "DEN_SOCKET="+d.socket)
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Process.Kill(); _ = long.Wait() }()
	if !eventually(2*time.Minute, func() bool { return strings.Contains(d.must("exec", "c", "--", "ps"), "sleep 601") }) {
		t.Fatal("the long exec in c did not start")
	}

	_, err := d.run("create", "d", "--memory", "128M", "--idle-timeout", "1h")
	want := "not enough memory: 256 MiB needed, 128 MiB free in the budget; running VMs that cannot sleep: a (keep-awake lease held), c (1 session(s) open)"
	if exitCode(err) == 0 || !strings.Contains(stderrOf(err), want) {
		t.Fatalf("create over the budget: exit %d, %q; want %q", exitCode(err), stderrOf(err), want)
	}
	if _, err := d.run("info", "d"); err == nil {
		t.Fatal("the refused vm d exists")
	}
	if ls := d.must("ls", "--json"); strings.Contains(ls, `"d"`) {
		t.Fatalf("the refused vm d is listed: %s", ls)
	}
	d.wantStates(map[string]string{"a": "running", "b": "sleeping", "c": "running"})
	if m := d.memory(); m.Committed != 512<<20 || m.Running != 2 {
		t.Fatalf("memory after the refusal: %+v", m)
	}
	if out := d.must("exec", "a", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("a after the refusal: %q", out)
	}
}

// TestAdmissionPressure: host memory pressure (here a MemAvailable
// threshold above anything the host has, so the host always counts as
// under pressure) puts an idle VM to sleep for real, logged with its
// reason, and leaves a VM that never sleeps running; the slept VM wakes
// with its processes.
func TestAdmissionPressure(t *testing.T) {
	d := startDaemonIn(t, func(string) []string {
		return []string{"--memory-min-available", "100%", "--memory-pressure-cooldown", "1s"}
	})
	d.must("create", "keep", "--memory", "128M", "--idle-timeout", "0")
	d.must("create", "nap", "--memory", "128M", "--idle-timeout", "1h")
	d.must("exec", "nap", "--", "sh", "-c", startWork)
	d.waitState("nap", "sleeping", 2*time.Minute)
	if log, _ := os.ReadFile(d.logPath); !strings.Contains(string(log), `vm=nap reason="memory pressure: MemAvailable`) {
		t.Fatalf("the pressure sleep is not logged with its reason:\n%s", log)
	}
	if vm := d.info("keep"); vm.State != "running" {
		t.Fatalf("the vm that never sleeps: %+v", vm)
	}
	if out := d.must("exec", "nap", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("nap after its pressure sleep: %q", out)
	}
}
