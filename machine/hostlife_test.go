//go:build linux

package machine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// parallelProbe is a VMM hook that measures how many snapshots run at
// once: each waits (bounded) until limit of them are in, so that a
// parallel SleepAll shows its parallelism and a serial one its limit.
type parallelProbe struct {
	mu       sync.Mutex
	limit    int
	inflight int
	max      int
	reached  chan struct{}
}

func newParallelProbe(limit int) *parallelProbe {
	return &parallelProbe{limit: limit, reached: make(chan struct{})}
}

func (p *parallelProbe) hook(op, _ string) {
	if op != "snapshot" {
		return
	}
	p.mu.Lock()
	p.inflight++
	p.max = max(p.max, p.inflight)
	if p.inflight == p.limit {
		select {
		case <-p.reached:
		default:
			close(p.reached)
		}
	}
	p.mu.Unlock()
	select {
	case <-p.reached:
	case <-time.After(10 * time.Second):
	}
	p.mu.Lock()
	p.inflight--
	p.mu.Unlock()
}

func (p *parallelProbe) maxInFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max
}

// TestShutdownSleepsAllAndBootWakes: the shutdown path puts every
// running VM to sleep, in parallel and never more than the limit at
// once, marks them, and refuses new work; the next Manager wakes them,
// the most recently active first, with their memory, and clears the
// marks. A VM already asleep is not marked: it wakes when used.
func TestShutdownSleepsAllAndBootWakes(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	names := []string{"a", "b", "c", "d"}
	mem := map[string]string{}
	for _, n := range names {
		e.create(n)
		mem[n] = e.memory(n)
	}
	e.create("idle")
	if err := e.m.Sleep(ctx, "idle", false); err != nil {
		t.Fatal(err)
	}
	probe := newParallelProbe(2)
	e.drv.Hook = probe.hook
	var reported []string
	res, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Parallel: 2, Timeout: 30 * time.Second},
		func(r machine.HostResult) { reported = append(reported, r.Name) })
	e.drv.Hook = nil
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(names) || len(reported) != len(names) {
		t.Fatalf("results %+v, reported %v; want one per running vm", res, reported)
	}
	for _, r := range res {
		if r.Err != nil || r.State != registry.StateSleeping {
			t.Fatalf("%s: %s, %v", r.Name, r.State, r.Err)
		}
	}
	if got := probe.maxInFlight(); got != 2 {
		t.Fatalf("%d sleeps at once, want 2 (the limit)", got)
	}
	for _, n := range names {
		vm := e.wantState(n, registry.StateSleeping)
		if !vm.WakeOnBoot || !strings.Contains(vm.Reason, "host shutdown") {
			t.Fatalf("%s after the shutdown path: mark %v, reason %q", n, vm.WakeOnBoot, vm.Reason)
		}
	}
	if vm := e.record("idle"); vm.WakeOnBoot {
		t.Fatal("a vm asleep before the shutdown was marked")
	}
	// Nothing wakes a VM now: the VMMs are about to be killed.
	if err := e.m.Wake(ctx, "a"); !errors.Is(err, machine.ErrConflict) || !strings.Contains(err.Error(), "host is shutting down") {
		t.Fatalf("wake after the shutdown path: %v", err)
	}

	// The boot: last activity decides the order (d, b, c, a).
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	db := e.reg
	now := time.Now().UTC()
	for n, ago := range map[string]time.Duration{"a": 3 * time.Hour, "b": time.Hour, "c": 2 * time.Hour, "d": time.Minute} {
		if _, err := db.UpdateVM(ctx, n, func(v *registry.VM) error { v.LastActive = now.Add(-ago); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var order []string
	e.drv.Hook = func(op, rd string) {
		if op == "restore" {
			mu.Lock()
			order = append(order, rd[strings.LastIndex(rd, "/")+1:])
			mu.Unlock()
		}
	}
	e.cfg.BootWakeParallel = 1
	e.open()
	testutil.WaitForWithin(t, testTimeout, "the marked vms running", func() bool {
		for _, n := range names {
			if vm := e.record(n); vm.State != registry.StateRunning || vm.WakeOnBoot {
				return false
			}
		}
		return true
	})
	e.drv.Hook = nil
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "d,b,c,a" {
		t.Fatalf("boot wake order %s, want d,b,c,a (most recently active first)", got)
	}
	for _, n := range names {
		if vm := e.record(n); vm.Reason != "" {
			t.Fatalf("%s woken, reason still %q", n, vm.Reason)
		}
		if e.memory(n) != mem[n] {
			t.Fatalf("%s was cold-booted, not woken", n)
		}
	}
	e.wantState("idle", registry.StateSleeping)
}

// TestShutdownRecordsWhatWasLost: a VM whose VMM hangs cannot be put to
// sleep within the bound: den stops it and records it stopped with the
// reason and its last checkpoint, unmarked; the others sleep. After the
// restart the lost VM still says so and is not woken.
func TestShutdownRecordsWhatWasLost(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("ok")
	e.create("hung")
	if _, err := e.m.Checkpoint(ctx, "hung", machine.CheckpointOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	hung := e.drv.VM(e.state.Run("hung"))
	e.drv.Hook = func(op, rd string) {
		if op == "pause" && strings.HasSuffix(rd, "/hung") {
			// A hung VMM: it answers nothing until it dies.
			select {
			case <-hung.Exited():
			case <-time.After(testTimeout):
			}
		}
	}
	start := time.Now()
	res, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 8 * time.Second}, nil)
	took := time.Since(start)
	e.drv.Hook = nil
	if err != nil {
		t.Fatal(err)
	}
	if took > 9*time.Second {
		t.Fatalf("the shutdown path took %s, bound 8s", took)
	}
	byName := map[string]machine.HostResult{}
	for _, r := range res {
		byName[r.Name] = r
	}
	if r := byName["ok"]; r.Err != nil || r.State != registry.StateSleeping {
		t.Fatalf("ok: %+v", r)
	}
	r := byName["hung"]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "host shut down before it could sleep") {
		t.Fatalf("hung: %+v", r)
	}
	check := func(when string) {
		t.Helper()
		vm := e.wantState("hung", registry.StateStopped)
		for _, want := range []string{"host shut down before it could sleep", "processes are lost", "last checkpoint cp-1, taken"} {
			if !strings.Contains(vm.Reason, want) {
				t.Fatalf("%s: hung's reason %q lacks %q", when, vm.Reason, want)
			}
		}
		if vm.WakeOnBoot || strings.Contains(vm.Reason, "wakes it") {
			t.Fatalf("%s: hung claims it will be woken: %+v", when, vm)
		}
	}
	check("after the shutdown path")
	if e.drv.VM(e.state.Run("hung")) != nil {
		t.Fatal("hung's vmm still runs")
	}
	e.restart()
	testutil.WaitForWithin(t, testTimeout, "ok woken", func() bool { return e.record("ok").State == registry.StateRunning })
	check("after the restart")
}

// TestRestartWithoutShutdownKeepsVMsRunning: a daemon restart alone marks
// nothing and wakes nothing: running VMs are adopted as they are.
func TestRestartWithoutShutdownKeepsVMsRunning(t *testing.T) {
	e := newEnv(t)
	e.create("r1")
	e.create("r2")
	mem := e.memory("r1")
	boots := e.drv.Boots()
	e.restart()
	for _, n := range []string{"r1", "r2"} {
		if vm := e.wantState(n, registry.StateRunning); vm.WakeOnBoot {
			t.Fatalf("%s marked by a plain restart", n)
		}
	}
	if e.memory("r1") != mem || e.drv.Boots() != boots {
		t.Fatal("a plain restart restarted a vm")
	}
}

// TestSleepAllAndWakeAll: without Shutdown, SleepAll marks nothing, a VM
// with a session open is refused (and named) unless Force, and den goes
// on serving; WakeAll wakes every sleeping VM.
func TestSleepAllAndWakeAll(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for i := range 3 {
		e.create(fmt.Sprintf("v%d", i))
	}
	s, err := e.m.Open(ctx, "v1", "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.m.SleepAll(ctx, machine.HostOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if (r.Name == "v1") != (r.Err != nil) {
			t.Fatalf("%s: %v", r.Name, r.Err)
		}
		if r.Name == "v1" && (!strings.Contains(r.Err.Error(), "session") || r.State != registry.StateRunning) {
			t.Fatalf("v1 with a session: %+v", r)
		}
	}
	for _, n := range []string{"v0", "v2"} {
		if vm := e.wantState(n, registry.StateSleeping); vm.WakeOnBoot || vm.Reason != "" {
			t.Fatalf("%s marked by a plain sleep --all: %+v", n, vm)
		}
	}
	s.Release()
	res, err = e.m.SleepAll(ctx, machine.HostOptions{Force: true}, nil)
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("sleep --all --force: %+v, %v", res, err)
	}
	res, err = e.m.WakeAll(ctx, machine.HostOptions{Parallel: 2}, nil)
	if err != nil || len(res) != 3 {
		t.Fatalf("wake --all: %+v, %v", res, err)
	}
	for _, r := range res {
		if r.Err != nil || r.State != registry.StateRunning {
			t.Fatalf("wake --all: %+v", r)
		}
	}
	// A tiny bound: nothing starts that cannot finish; the VMs say so and
	// keep running.
	res, err = e.m.SleepAll(ctx, machine.HostOptions{Timeout: time.Nanosecond}, nil)
	if err != nil || len(res) != 3 {
		t.Fatalf("sleep --all with no time: %+v, %v", res, err)
	}
	for _, r := range res {
		if r.Err == nil {
			t.Fatalf("%s slept in no time", r.Name)
		}
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := range 3 {
		n := fmt.Sprintf("v%d", i)
		testutil.WaitForWithin(t, testTimeout, n+" running", func() bool {
			st, err := e.m.Get(ctx2, n)
			return err == nil && st.State == registry.StateRunning && st.Op == ""
		})
	}
}

// TestShutdownDuringBootWake: a host shutdown while the boot wake is
// under way (a reboot soon after a boot) leaves every VM asleep and
// marked: the VM being woken is put back to sleep, the others are not
// woken.
func TestShutdownDuringBootWake(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	names := []string{"a", "b", "c"}
	for _, n := range names {
		e.create(n)
	}
	if _, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	in, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.drv.Hook = func(op, _ string) {
		if op != "restore" {
			return
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(in)
			select {
			case <-release:
			case <-time.After(testTimeout):
			}
		}
	}
	e.cfg.BootWakeParallel = 1
	e.open()
	<-in
	done := make(chan error, 1)
	go func() {
		_, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 20 * time.Second}, nil)
		done <- err
	}()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.drv.Hook = nil
	for _, n := range names {
		if vm := e.wantState(n, registry.StateSleeping); !vm.WakeOnBoot {
			t.Fatalf("%s after a shutdown during the boot wake: %+v", n, vm)
		}
	}
	if live := e.drv.Live(); live != 0 {
		t.Fatalf("%d vmms left running", live)
	}
}
