//go:build linux

package machine_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/machine/machinetest"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// refusedForHost fails the test unless err is the refusal of new work
// during (or after) a host shutdown.
func refusedForHost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, machine.ErrConflict) || !strings.Contains(err.Error(), "the host is shutting down") {
		t.Errorf("%s during a host shutdown: %v; want it refused (the host is shutting down)", what, err)
	}
}

// gate blocks a fake VMM operation of one VM until released (bounded),
// and says when it was reached.
type gate struct {
	op, vm  string
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func newGate(op, vm string) *gate {
	return &gate{op: op, vm: vm, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) hook(op, rd string) {
	if op != g.op || !strings.HasSuffix(rd, "/"+g.vm) {
		return
	}
	first := false
	g.once.Do(func() { first = true })
	if !first {
		return
	}
	close(g.reached)
	select {
	case <-g.release:
	case <-time.After(testTimeout):
	}
}

func (g *gate) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.reached:
	case <-time.After(testTimeout):
		t.Fatalf("%s of %s never reached", g.op, g.vm)
	}
}

// TestShutdownRefusesNewWork: from the moment a host shutdown begins, a
// session (exec, ssh, a URL's request) on a sleeping or a running VM, a
// wake, a create, a fork, a restore and a checkpoint are refused with
// one line saying the host is shutting down; after it ends they still
// are. The VM asleep before stays asleep and unmarked, no VMM is left.
func TestShutdownRefusesNewWork(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("run")
	e.create("nap")
	cp, err := e.m.Checkpoint(ctx, "nap", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Sleep(ctx, "nap", false); err != nil {
		t.Fatal(err)
	}
	g := newGate("pause", "run")
	e.drv.Hook = g.hook
	done := make(chan error, 1)
	go func() {
		_, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 30 * time.Second}, nil)
		done <- err
	}()
	g.wait(t) // the shutdown is putting run to sleep
	tryAll := func(when string) {
		t.Helper()
		for _, vm := range []string{"nap", "run"} {
			s, err := e.m.Open(ctx, vm, "")
			if err == nil {
				s.Release()
			}
			refusedForHost(t, when+": a session on "+vm, err)
		}
		refusedForHost(t, when+": wake", e.m.Wake(ctx, "nap"))
		_, err := e.m.Create(ctx, machine.CreateOptions{Name: "new", MemoryBytes: 128 << 20, DiskBytes: imageSize, Cold: true}, nil)
		refusedForHost(t, when+": create", err)
		_, err = e.m.Fork(ctx, "nap", cp.ID, "copy", nil)
		refusedForHost(t, when+": fork", err)
		_, err = e.m.Restore(ctx, "nap", cp.ID, machine.RestoreOptions{NoSave: true}, nil)
		refusedForHost(t, when+": restore", err)
		_, err = e.m.Checkpoint(ctx, "nap", machine.CheckpointOptions{}, nil)
		refusedForHost(t, when+": checkpoint", err)
	}
	tryAll("during")
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.drv.Hook = nil
	tryAll("after")
	if vm := e.wantState("nap", registry.StateSleeping); vm.WakeOnBoot {
		t.Errorf("nap, asleep before the shutdown, was marked: %+v", vm)
	}
	if vm := e.wantState("run", registry.StateSleeping); !vm.WakeOnBoot {
		t.Errorf("run not marked: %+v", vm)
	}
	if _, err := e.m.Record(ctx, "new"); !errors.Is(err, machine.ErrNotFound) {
		t.Errorf("a vm was created during the shutdown: %v", err)
	}
	if live := e.drv.Live(); live != 0 {
		t.Errorf("%d vmms left running after the shutdown", live)
	}
}

// TestShutdownAccountsForAWakeInFlight: a session that was waking a
// sleeping VM when the shutdown began is refused once the wake ends,
// and the shutdown puts that VM back to sleep and marks it; the next
// start wakes it.
func TestShutdownAccountsForAWakeInFlight(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("r")
	e.create("nap")
	if err := e.m.Sleep(ctx, "nap", false); err != nil {
		t.Fatal(err)
	}
	wake := newGate("restore", "nap")
	var rOnce sync.Once
	rPaused := make(chan struct{})
	e.drv.Hook = func(op, rd string) {
		if op == "pause" && strings.HasSuffix(rd, "/r") {
			rOnce.Do(func() { close(rPaused) })
		}
		wake.hook(op, rd)
	}
	opened := make(chan error, 1)
	go func() {
		s, err := e.m.Open(ctx, "nap", "")
		if err == nil {
			s.Release()
		}
		opened <- err
	}()
	wake.wait(t) // nap is being woken for the session
	done := make(chan error, 1)
	go func() {
		_, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 30 * time.Second}, nil)
		done <- err
	}()
	select {
	case <-rPaused: // the shutdown began
	case <-time.After(testTimeout):
		t.Fatal("the shutdown never put r to sleep")
	}
	close(wake.release)
	refusedForHost(t, "a session whose wake was under way", <-opened)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.drv.Hook = nil
	for _, n := range []string{"r", "nap"} {
		if vm := e.wantState(n, registry.StateSleeping); !vm.WakeOnBoot || !strings.Contains(vm.Reason, "host shutdown") {
			t.Fatalf("%s after the shutdown: %+v", n, vm)
		}
	}
	if live := e.drv.Live(); live != 0 {
		t.Fatalf("%d vmms left running after the shutdown", live)
	}
	e.restart()
	testutil.WaitForWithin(t, testTimeout, "both vms woken at the start", func() bool {
		return e.record("r").State == registry.StateRunning && e.record("nap").State == registry.StateRunning
	})
}

// TestShutdownWaitsForDigests: the shutdown returns only once the
// memory it wrote has its digests, so the boot wake refuses a slot
// damaged meanwhile: the VM stays asleep and its record says why.
func TestShutdownWaitsForDigests(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	res, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 30 * time.Second}, nil)
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("shutdown: %+v, %v", res, err)
	}
	slot := e.hostDir(storage.SuspendDir("a"))
	if !checkpoint.Sealed(slot) {
		t.Fatal("the shutdown returned before the digests of the memory it wrote")
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.FlipBytes(t, filepath.Join(slot, machinetest.RAMFile), 33<<20)
	e.open()
	testutil.WaitForWithin(t, testTimeout, "the boot wake done with a", func() bool { return !e.record("a").WakeOnBoot })
	vm := e.wantState("a", registry.StateSleeping)
	if !strings.Contains(vm.Reason, "den did not wake it when it started") || !strings.Contains(vm.Reason, "is damaged") {
		t.Fatalf("reason %q", vm.Reason)
	}
	if live := e.drv.Live(); live != 0 {
		t.Fatalf("%d vmms running", live)
	}
	if err := e.m.Wake(ctx, "a"); !errors.Is(err, machine.ErrDamaged) {
		t.Fatalf("wake of the damaged slot: %v", err)
	}
}

// TestBootWakeLeavesUnsealedMemoryAsleep: a slot whose memory got no
// digests before the host went down (the shutdown's bound ran out) is
// not restored by the boot wake: digests written after the reboot would
// vouch for whatever the file then holds. The VM stays asleep, unmarked,
// and its record says why.
func TestBootWakeLeavesUnsealedMemoryAsleep(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	if _, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 30 * time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	slot := e.hostDir(storage.SuspendDir("a"))
	ents, _ := os.ReadDir(slot)
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), "digests-") {
			if err := os.Remove(filepath.Join(slot, ent.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.FlipBytes(t, filepath.Join(slot, machinetest.RAMFile), 33<<20)
	e.open()
	testutil.WaitForWithin(t, testTimeout, "the boot wake done with a", func() bool { return !e.record("a").WakeOnBoot })
	vm := e.wantState("a", registry.StateSleeping)
	if !strings.Contains(vm.Reason, "got no digests before the host shut down") {
		t.Fatalf("reason %q", vm.Reason)
	}
	if live := e.drv.Live(); live != 0 {
		t.Fatalf("%d vmms running", live)
	}
}

// gatedStore is the registry with a hook before each new VM's record.
type gatedStore struct {
	registry.Store
	create func(name string)
}

func (g gatedStore) CreateVM(ctx context.Context, vm registry.VM) error {
	g.create(vm.Name)
	return g.Store.CreateVM(ctx, vm)
}

// TestShutdownSleepsACreateInFlight: a create that holds its new name
// when a host shutdown begins, before the VM has a record, is waited
// for, and the VM it made is put to sleep and marked like the others,
// not left running through the shutdown.
func TestShutdownSleepsACreateInFlight(t *testing.T) {
	reserve := newGate("create", "late")
	e := newEnvWith(t, func(c *machine.Config) {
		c.Registry = gatedStore{Store: c.Registry, create: func(name string) { reserve.hook("create", "/"+name) }}
	})
	ctx := ctxT(t)
	e.create("r")
	var rOnce sync.Once
	rPaused := make(chan struct{})
	e.drv.Hook = func(op, rd string) {
		if op == "pause" && strings.HasSuffix(rd, "/r") {
			rOnce.Do(func() { close(rPaused) })
		}
	}
	created := make(chan error, 1)
	go func() {
		_, err := e.m.Create(ctx, machine.CreateOptions{Name: "late", MemoryBytes: 128 << 20, DiskBytes: imageSize, Cold: true}, nil)
		created <- err
	}()
	reserve.wait(t) // late's name is taken, its record not written yet
	done := make(chan error, 1)
	go func() {
		_, err := e.m.SleepAll(ctx, machine.HostOptions{Shutdown: true, Timeout: 30 * time.Second}, nil)
		done <- err
	}()
	select {
	case <-rPaused: // the shutdown began, with late in flight
	case <-time.After(testTimeout):
		t.Fatal("the shutdown never put r to sleep")
	}
	close(reserve.release)
	if err := <-created; err != nil {
		t.Fatalf("the create in flight: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.drv.Hook = nil
	for _, n := range []string{"r", "late"} {
		if vm := e.wantState(n, registry.StateSleeping); !vm.WakeOnBoot {
			t.Fatalf("%s after the shutdown: %+v; want asleep and marked to wake", n, vm)
		}
	}
	if live := e.drv.Live(); live != 0 {
		t.Fatalf("%d vmms left running after the shutdown", live)
	}
}
