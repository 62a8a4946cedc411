//go:build linux

package machine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// TestTransitions walks every edge of the state table through the
// operations that take it, and checks that the table refuses the rest
// with a typed error.
func TestTransitions(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	taken := map[[2]registry.State]bool{}
	last := map[string]registry.State{}
	note := func(name string) {
		vm, err := e.m.Record(ctx, name)
		if err != nil {
			last[name] = ""
			return
		}
		if from, ok := last[name]; ok && from != vm.State {
			taken[[2]registry.State{from, vm.State}] = true
		}
		last[name] = vm.State
	}
	// creating -> running (and creating -> deleting: an interrupted
	// create rolled back at start-up).
	last["a"] = registry.StateCreating
	e.create("a")
	note("a")
	// running -> sleeping -> running
	if err := e.m.Sleep(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	note("a")
	if err := e.m.Wake(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	note("a")
	// running -> stopped (the VMM dies) -> running (next use boots it)
	e.drv.VM(e.state.Run("a")).Kill()
	testutil.WaitForWithin(t, testTimeout, "a recorded stopped", func() bool { return e.record("a").State == registry.StateStopped })
	note("a")
	if err := e.m.Wake(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	note("a")
	// sleeping -> stopped -> running: a restore of a sleeping vm to a
	// disk-only checkpoint.
	cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{DiskOnly: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Sleep(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	note("a")
	// A restore passes through stopped (recorded before the disk is
	// replaced); watch the record while it runs.
	seen := e.watchStates("a")
	if _, err := e.m.Restore(ctx, "a", cp.ID, machine.RestoreOptions{NoSave: true}, nil); err != nil {
		t.Fatal(err)
	}
	if seen()[registry.StateStopped] {
		taken[[2]registry.State{registry.StateSleeping, registry.StateStopped}] = true
		taken[[2]registry.State{registry.StateStopped, registry.StateRunning}] = true
	}
	note("a")
	// stopped -> deleting, running -> deleting, sleeping -> deleting
	e.create("b")
	e.drv.VM(e.state.Run("b")).Kill()
	testutil.WaitForWithin(t, testTimeout, "b recorded stopped", func() bool { return e.record("b").State == registry.StateStopped })
	e.create("c")
	if err := e.m.Sleep(ctx, "c", false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		from := e.record(n).State
		if err := e.m.Remove(ctx, n, true); err != nil {
			t.Fatal(err)
		}
		taken[[2]registry.State{from, registry.StateDeleting}] = true
	}
	// creating -> stopped: a create whose VMM died before it was done
	// is rolled back instead; the edge is the table's, for a VMM dying
	// mid-create of a future driver. The edges of lost, which a cluster
	// host's takeover takes, are TestVMLeases's. Everything else must
	// have been taken.
	for from, tos := range registry.Transitions() {
		for _, to := range tos {
			lost := from == registry.StateLost || to == registry.StateLost
			if !taken[[2]registry.State{from, to}] && !(from == registry.StateCreating && to != registry.StateRunning) && !lost {
				t.Errorf("transition %s -> %s not exercised", from, to)
			}
		}
	}
	// Refused transitions are typed errors.
	err = registry.CheckTransition(registry.StateDeleting, registry.StateRunning)
	var te *registry.TransitionError
	if !errors.As(err, &te) || !errors.Is(err, registry.ErrIllegalTransition) {
		t.Fatalf("deleting -> running: %v", err)
	}
}

// watchStates reads name's record over and over until the returned
// function is called, which answers every state the reads saw. It
// returns once a first read is done: the reads are under way (their
// connection to the registry made) before what they watch begins.
func (e *env) watchStates(name string) func() map[registry.State]bool {
	seen := map[registry.State]bool{}
	stop, done, first := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			if n == 1 {
				close(first)
			}
			select {
			case <-stop:
				return
			default:
			}
			if vm, err := e.m.Record(context.Background(), name); err == nil {
				seen[vm.State] = true
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(testTimeout):
		e.t.Fatal("the record's first read never came back")
	}
	return func() map[registry.State]bool {
		close(stop)
		<-done
		return seen
	}
}

// TestReadsNeverChangeState runs sleep/wake cycles while other
// goroutines read the VM as fast as they can (den info, den ls, a
// stranger's info): every read sees a legal state, the record never
// says "vmm process not found", and the guest's memory survives every
// wake (it was never cold-booted).
func TestReadsNeverChangeState(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.vol.UsageDelay = 20 * time.Millisecond // as slow as JuiceFS's metadata on S3
	e.create("nap")
	mem := e.memory("nap")
	boots := e.drv.Boots()
	stop := make(chan struct{})
	var reads atomic.Int64
	var bad atomic.Value
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, err := e.m.Get(context.Background(), "nap")
				if err == nil && strings.Contains(st.Reason, "not found") {
					bad.Store(fmt.Sprintf("read saw %s: %s", st.State, st.Reason))
				}
				if _, err := e.m.List(context.Background(), ""); err != nil {
					bad.Store("list: " + err.Error())
				}
				reads.Add(1)
			}
		}()
	}
	for i := 0; i < 8; i++ {
		if err := e.m.Sleep(ctx, "nap", false); err != nil {
			t.Fatalf("sleep %d: %v", i, err)
		}
		if st := e.record("nap"); st.State != registry.StateSleeping {
			t.Fatalf("after sleep %d: %s (%s)", i, st.State, st.Reason)
		}
		// Let reads that began while the vm was running finish against
		// the sleeping vm (as den ls polling a sleep does).
		n := reads.Load()
		testutil.WaitForWithin(t, testTimeout, "reads after the sleep", func() bool { return reads.Load() >= n+6 })
		if st := e.record("nap"); st.State != registry.StateSleeping {
			t.Fatalf("reads after sleep %d changed it to %s (%s)", i, st.State, st.Reason)
		}
		if err := e.m.Wake(ctx, "nap"); err != nil {
			t.Fatalf("wake %d: %v", i, err)
		}
		if got := e.memory("nap"); got != mem {
			t.Fatalf("wake %d: guest memory %q, want %q (cold-booted)", i, got, mem)
		}
	}
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if e.drv.Boots() != boots {
		t.Fatalf("%d cold boots during sleep/wake cycles", e.drv.Boots()-boots)
	}
	t.Logf("%d reads raced 8 sleep/wake cycles", reads.Load())
}

// TestSessionAndSleepNeverBoth races session admissions against sleeps:
// a sleep either happens before a session is admitted (which then wakes
// the VM) or not at all while one is open.
func TestSessionAndSleepNeverBoth(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("s")
	var wg sync.WaitGroup
	var fails atomic.Value
	done := make(chan struct{})
	var sleeps atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			err := e.m.Sleep(context.Background(), "s", false)
			if err == nil {
				sleeps.Add(1)
			} else if !errors.Is(err, machine.ErrConflict) {
				fails.Store("sleep: " + err.Error())
				return
			}
		}
	}()
	var openers sync.WaitGroup
	for g := 0; g < 3; g++ {
		openers.Add(1)
		go func(g int) {
			defer openers.Done()
			for i := 0; i < 25; i++ {
				s, err := e.m.Open(ctx, "s", "")
				if err != nil {
					fails.Store(fmt.Sprintf("open %d/%d: %v", g, i, err))
					return
				}
				// While the session is open the VM runs and stays running.
				select {
				case <-s.Done:
					fails.Store(fmt.Sprintf("session %d/%d: the vm stopped under it", g, i))
				case <-time.After(3 * time.Millisecond):
				}
				if st, err := e.m.Record(ctx, "s"); err != nil || st.State != registry.StateRunning {
					fails.Store(fmt.Sprintf("session %d/%d open on a %s vm", g, i, st.State))
				}
				s.Release()
				time.Sleep(time.Duration(i%3) * time.Millisecond)
			}
		}(g)
	}
	openers.Wait()
	close(done)
	wg.Wait()
	if v := fails.Load(); v != nil {
		t.Fatal(v)
	}
	t.Logf("%d sleeps between 75 sessions", sleeps.Load())
	// With a session open, sleep refuses unless forced.
	s, err := e.m.Open(ctx, "s", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Sleep(ctx, "s", false); !errors.Is(err, machine.ErrConflict) {
		t.Fatalf("sleep with a session open: %v", err)
	}
	s.Release()
}

// TestRestoreAndRemoveVersusSessions: restore refuses while an exec runs
// (unless forced); rm ends sessions and leaves nothing behind.
func TestRestoreAndRemoveVersusSessions(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("r")
	cp, err := e.m.Checkpoint(ctx, "r", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.m.Open(ctx, "r", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Restore(ctx, "r", cp.ID, machine.RestoreOptions{NoSave: true}, nil); !errors.Is(err, machine.ErrConflict) {
		t.Fatalf("restore during a session: %v", err)
	}
	// The refused restore left the VM usable: new sessions are admitted.
	s2, err := e.m.Open(ctx, "r", "")
	if err != nil {
		t.Fatalf("session after a refused restore: %v", err)
	}
	s2.Release()
	s.Release()
	if _, err := e.m.Restore(ctx, "r", cp.ID, machine.RestoreOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	// rm racing sessions: every Open either succeeds before the rm or
	// fails with not found / conflict; nothing is left afterwards.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad atomic.Value
	var opened atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := e.m.Open(context.Background(), "r", "")
			if err == nil {
				opened.Add(1)
				s.Release()
			} else if !errors.Is(err, machine.ErrNotFound) && !errors.Is(err, machine.ErrConflict) && !strings.Contains(err.Error(), "vmm") {
				bad.Store(err.Error())
			}
		}
	}()
	testutil.WaitForWithin(t, testTimeout, "sessions opening before the rm", func() bool { return opened.Load() >= 3 })
	if err := e.m.Remove(ctx, "r", true); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("open racing rm: %v", v)
	}
	if _, err := e.m.Record(ctx, "r"); !errors.Is(err, machine.ErrNotFound) {
		t.Fatalf("record after rm: %v", err)
	}
	testutil.WaitForWithin(t, testTimeout, "no vmm left", func() bool { return e.drv.Live() == 0 })
}

// TestConcurrentCheckpoints: checkpoints of one VM taken at once all
// succeed, with distinct ids, each complete.
func TestConcurrentCheckpoints(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("c")
	var wg sync.WaitGroup
	ids := make(chan string, 4)
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cp, err := e.m.Checkpoint(ctx, "c", machine.CheckpointOptions{DiskOnly: i%2 == 0}, nil)
			if err != nil {
				errs <- err
				return
			}
			ids <- cp.ID
		}(i)
	}
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("id %s given twice", id)
		}
		seen[id] = true
		if _, err := e.m.Fork(ctx, "c", id, "f"+strings.TrimPrefix(id, "cp-"), nil); err != nil {
			t.Fatalf("fork from %s: %v", id, err)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("%d checkpoints", len(seen))
	}
}

// TestForkVersusRemoveOfSource: a fork and an rm of its source at once:
// either the fork is whole or it left nothing, and the source is gone.
func TestForkVersusRemoveOfSource(t *testing.T) {
	for i := 0; i < 4; i++ {
		e := newEnv(t)
		ctx := ctxT(t)
		e.create("src")
		cp, err := e.m.Checkpoint(ctx, "src", machine.CheckpointOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var forkErr, rmErr error
		wg.Add(2)
		go func() { defer wg.Done(); _, forkErr = e.m.Fork(ctx, "src", cp.ID, "dst", nil) }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Millisecond)
			rmErr = e.m.Remove(ctx, "src", true)
		}()
		wg.Wait()
		if rmErr != nil {
			t.Fatalf("rm: %v", rmErr)
		}
		rec, err := e.m.Record(ctx, "dst")
		switch {
		case forkErr == nil:
			if err != nil || rec.State != registry.StateRunning {
				t.Fatalf("fork succeeded but dst is %+v, %v", rec, err)
			}
			if _, err := e.m.Open(ctx, "dst", ""); err != nil {
				t.Fatalf("forked vm unusable: %v", err)
			}
		case errors.Is(err, machine.ErrNotFound):
			if p, _ := e.vol.Path(storage.VMDir("dst")); dirExists(p) {
				t.Fatalf("failed fork (%v) left %s", forkErr, p)
			}
		default:
			t.Fatalf("fork failed (%v) but left a record: %+v %v", forkErr, rec, err)
		}
		e.m.Close()
	}
}

// TestForkOntoExistingName changes nothing: no checkpoint, no head move.
func TestForkOntoExistingName(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("one")
	e.create("two")
	cps, head, err := e.m.Checkpoints(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Fork(ctx, "one", "", "two", nil); !errors.Is(err, machine.ErrExists) {
		t.Fatalf("fork onto an existing name: %v", err)
	}
	cps2, head2, _ := e.m.Checkpoints(ctx, "one")
	if len(cps2) != len(cps) || head2 != head {
		t.Fatalf("a refused fork left %d checkpoints (was %d), head %q (was %q)", len(cps2), len(cps), head2, head)
	}
}

// TestFailedForkRollsBack: a fork whose bring-up fails leaves no VM, no
// checkpoint and no head move on the source.
func TestFailedForkRollsBack(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("one")
	_, head, _ := e.m.Checkpoints(ctx, "one")
	e.drv.Hook = func(op, rd string) {
		if op == "restore" && strings.HasSuffix(rd, "/three") {
			e.drv.VM(e.state.Run("three")).Kill()
		}
	}
	if _, err := e.m.Fork(ctx, "one", "", "three", nil); err == nil {
		t.Fatal("fork with a dying vmm succeeded")
	}
	e.drv.Hook = nil
	cps, head2, _ := e.m.Checkpoints(ctx, "one")
	if len(cps) != 0 || head2 != head {
		t.Fatalf("failed fork left checkpoints %v, head %q (was %q)", cps, head2, head)
	}
	if _, err := e.m.Record(ctx, "three"); !errors.Is(err, machine.ErrNotFound) {
		t.Fatalf("failed fork left a record: %v", err)
	}
}

// TestVMMDeathRecordedByOwner: a VMM killed from outside is recorded
// stopped with the reason, and the next use boots the VM.
func TestVMMDeathRecordedByOwner(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("k")
	e.drv.VM(e.state.Run("k")).Kill()
	testutil.WaitForWithin(t, testTimeout, "k recorded stopped", func() bool { return e.record("k").State == registry.StateStopped })
	if r := e.record("k").Reason; !strings.Contains(r, "killed") {
		t.Fatalf("reason %q", r)
	}
	s, err := e.m.Open(ctx, "k", "")
	if err != nil {
		t.Fatal(err)
	}
	s.Release()
	e.wantState("k", registry.StateRunning)
}

// TestBusyNamesHolder: waiting for a VM is bounded and the refusal says
// who holds it.
func TestBusyNamesHolder(t *testing.T) {
	e := newEnv(t)
	e.create("b")
	in := make(chan struct{})
	out := make(chan struct{})
	e.drv.Hook = func(op, rd string) {
		if op == "snapshot" {
			close(in)
			<-out
		}
	}
	go func() { _, _ = e.m.Checkpoint(context.Background(), "b", machine.CheckpointOptions{}, nil) }()
	<-in
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := e.m.Sleep(ctx, "b", false)
	close(out)
	if !errors.Is(err, machine.ErrBusy) || !strings.Contains(err.Error(), `vm "b" is busy: checkpoint since`) {
		t.Fatalf("sleep of a vm being checkpointed: %v", err)
	}
}

// TestSecondDaemonRefused: one daemon per state dir.
func TestSecondDaemonRefused(t *testing.T) {
	dir := machine.StateDir(t.TempDir())
	unlock, err := machine.LockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := machine.LockStateDir(dir); err == nil || !strings.Contains(err.Error(), "another den daemon") {
		t.Fatalf("second lock: %v", err)
	}
	unlock()
	unlock2, err := machine.LockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	unlock2()
}

// TestVolumeLossStopsVMs: a VM whose disk was on a mount that died is
// not left running on it: it is stopped with the reason, and boots when
// next used.
func TestVolumeLossStopsVMs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("v")
	e.vol.Emit(storage.Event{Kind: storage.EventLost, Err: errors.New("mount process 42 exited")})
	testutil.WaitForWithin(t, testTimeout, "v stopped after the volume loss", func() bool { return e.record("v").State == registry.StateStopped })
	if r := e.record("v").Reason; !strings.Contains(r, "storage volume lost") {
		t.Fatalf("reason %q", r)
	}
	if e.drv.VM(e.state.Run("v")) != nil {
		t.Fatal("vmm still running on the lost volume")
	}
	// The volume is still being remounted (its files are not there) when
	// the vm is reached: the start waits for it instead of failing.
	disk, _ := e.vol.Path(storage.VMDisk("v"))
	if err := os.Rename(disk, disk+".away"); err != nil {
		t.Fatal(err)
	}
	e.vol.SetFail(storage.ErrNotMounted)
	woke := make(chan error, 1)
	probes := e.vol.HealthCalls()
	go func() { woke <- e.m.Wake(ctx, "v") }()
	testutil.WaitForWithin(t, testTimeout, "the wake waiting for the volume", func() bool { return e.vol.HealthCalls() > probes })
	if err := os.Rename(disk+".away", disk); err != nil {
		t.Fatal(err)
	}
	e.vol.SetFail(nil)
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	e.wantState("v", registry.StateRunning)
}

// TestRestartAdopts: a new Manager (daemon restart) adopts running VMMs
// and keeps sleeping VMs asleep.
func TestRestartAdopts(t *testing.T) {
	e := newEnv(t)
	e.create("x")
	e.create("y")
	if err := e.m.Sleep(ctxT(t), "y", false); err != nil {
		t.Fatal(err)
	}
	mem := e.memory("x")
	e.restart()
	e.wantState("x", registry.StateRunning)
	e.wantState("y", registry.StateSleeping)
	if e.memory("x") != mem {
		t.Fatal("x was restarted, not adopted")
	}
}

func dirExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestCrashMidDeleteStaysDeleted: a checkpoint deletion cut short after
// its files were retired is finished at the next start; the checkpoint
// does not come back and the head does not move to it.
func TestCrashMidDeleteStaysDeleted(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("d")
	for i := 0; i < 2; i++ {
		if _, err := e.m.Checkpoint(ctx, "d", machine.CheckpointOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// What a crash leaves after the first step of deleting cp-1.
	from, _ := e.vol.Path(storage.CheckpointDir("d", "cp-1"))
	to, _ := e.vol.Path(storage.CheckpointsDir("d").Join("tmp-deleted-cp-1"))
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
	e.restart()
	cps, head, err := e.m.Checkpoints(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	if len(cps) != 1 || cps[0].ID != "cp-2" || head != "cp-2" {
		t.Fatalf("after a crash mid-delete: %+v, head %q", cps, head)
	}
}

// TestWakeFailingAfterGuestRan: a wake that fails once the restored guest
// has run (its agent never answers) does not leave the VM asleep on a
// slot older than its disk: it is recorded stopped and boots next time.
func TestWakeFailingAfterGuestRan(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("w")
	if err := e.m.Sleep(ctx, "w", false); err != nil {
		t.Fatal(err)
	}
	var restored atomic.Bool
	e.drv.Hook = func(op, rd string) {
		switch {
		case op == "restore":
			restored.Store(true)
		case op == "dial" && restored.Load():
			if v := e.drv.VM(e.state.Run("w")); v != nil {
				v.Kill() // before the dial goes on: the guest dies as it is reached
			}
		}
	}
	if err := e.m.Wake(ctx, "w"); err == nil {
		t.Fatal("wake with a dying guest succeeded")
	}
	e.drv.Hook = nil
	st := e.wantState("w", registry.StateStopped)
	if !strings.Contains(st.Reason, "wake failed after the guest ran") {
		t.Fatalf("reason %q", st.Reason)
	}
	boots := e.drv.Boots()
	if err := e.m.Wake(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if e.drv.Boots() != boots+1 {
		t.Fatal("the vm was not booted from its disk")
	}
}

// TestVolumeLossWaitsForOperation: a VM that an operation holds when the
// mount dies is stopped as soon as the operation lets go.
func TestVolumeLossWaitsForOperation(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	e.create("b")
	in := make(chan struct{})
	out := make(chan struct{})
	var once sync.Once
	e.drv.Hook = func(op, rd string) {
		if op == "snapshot" && strings.HasSuffix(rd, "/a") {
			once.Do(func() { close(in); <-out })
		}
	}
	done := make(chan error, 1)
	go func() { _, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil); done <- err }()
	<-in
	e.vol.Emit(storage.Event{Kind: storage.EventLost})
	testutil.WaitForWithin(t, testTimeout, "b stopped", func() bool { return e.record("b").State == registry.StateStopped })
	close(out)
	<-done
	testutil.WaitForWithin(t, testTimeout, "a stopped once its checkpoint let go", func() bool { return e.record("a").State == registry.StateStopped })
	if e.drv.VM(e.state.Run("a")) != nil {
		t.Fatal("a's vmm still runs on the lost volume")
	}
}

// TestRetiredSlotsAndStagedDisks: the suspend slots a sleep or a restore
// retires are removed in the background, however many operations follow
// each other; a restore refused after its checkpoint's disk was staged
// keeps that disk as the checkpoint's spare; and the leftovers a crash
// leaves in a VM's directory (retired slots, half-made clones) go at the
// next start.
func TestRetiredSlotsAndStagedDisks(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("r")
	cp, err := e.m.Checkpoint(ctx, "r", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := e.m.Sleep(ctx, "r", false); err != nil {
			t.Fatal(err)
		}
		if err := e.m.Wake(ctx, "r"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.Sleep(ctx, "r", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Restore(ctx, "r", cp.ID, machine.RestoreOptions{NoSave: true}, nil); err != nil {
		t.Fatal(err)
	}
	vmDir, _ := e.vol.Path(storage.VMDir("r"))
	leftovers := func() []string {
		var left []string
		ents, _ := os.ReadDir(vmDir)
		for _, ent := range ents {
			if strings.HasPrefix(ent.Name(), "suspend-old") || storage.IsCloneTemp(ent.Name()) || ent.Name() == "disk-restoring" {
				left = append(left, ent.Name())
			}
		}
		return left
	}
	testutil.WaitForWithin(t, testTimeout, "the retired suspend slots are removed", func() bool { return len(leftovers()) == 0 })
	if _, err := os.Stat(filepath.Join(vmDir, "suspend")); err == nil {
		t.Fatal("a restored vm kept its suspend slot")
	}

	// A restore whose save of the current state fails (the VMM dies as
	// it snapshots) is refused after the checkpoint's disk was staged.
	var spare string
	testutil.WaitForWithin(t, testTimeout, "the restore's spare is made", func() bool { spare = e.spare("r", cp.ID); return spare != "" })
	if err := os.Remove(spare); err != nil {
		t.Fatal(err)
	}
	e.drv.Hook = func(op, rd string) {
		if op == "snapshot" {
			if v := e.drv.VM(e.state.Run("r")); v != nil {
				v.Kill()
			}
		}
	}
	if _, err := e.m.Restore(ctx, "r", cp.ID, machine.RestoreOptions{}, nil); err == nil {
		t.Fatal("a restore whose save failed went on")
	}
	e.drv.Hook = nil
	if !dirExists(spare) {
		t.Fatal("the staged disk of a refused restore was not kept as the checkpoint's spare")
	}
	if len(leftovers()) != 0 {
		t.Fatalf("a refused restore left %v", leftovers())
	}

	// What a crash leaves: a retired slot and half-made clones.
	for _, f := range []string{"suspend-old-1", ".disk.clone-2", ".disk-restoring.clone-3", "disk-restoring"} {
		if err := os.WriteFile(filepath.Join(vmDir, f), []byte("left"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.restart()
	if !poll.Until(testTimeout, func() bool { return len(leftovers()) == 0 }) {
		t.Fatalf("after a start, a crash left %v", leftovers())
	}
	if _, err := os.Stat(filepath.Join(vmDir, "disk")); err != nil {
		t.Fatalf("the vm's disk: %v", err)
	}
}

// TestRestoreKillsTheVMMItReplaces: a restore kills the running VMM (its
// memory and disk writes are thrown away) instead of having it quit,
// while a sleep, which keeps them, still has it quit.
func TestRestoreKillsTheVMMItReplaces(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("k")
	cp, err := e.m.Checkpoint(ctx, "k", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := e.drv.VM(e.state.Run("k")).Memory()
	var mu sync.Mutex
	var stops []string
	e.drv.Hook = func(op, _ string) {
		if op == "shutdown" || op == "discard" {
			mu.Lock()
			stops = append(stops, op)
			mu.Unlock()
		}
	}
	if _, err := e.m.Restore(ctx, "k", cp.ID, machine.RestoreOptions{NoSave: true}, nil); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.VM(e.state.Run("k")).Memory(); got != want {
		t.Fatalf("restored memory %q, want the checkpoint's %q", got, want)
	}
	if err := e.m.Sleep(ctx, "k", false); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(stops, ",") != "discard,shutdown" {
		t.Fatalf("stops %v, want the restore's discard, then the sleep's shutdown", stops)
	}
}

// TestRestartStopsPrelaunchedVMMs: a VMM a crash left prelaunched for a
// restore (its runtime dir _pre-VM-N, its PID file) is stopped and its
// dir removed at the next start; the VMs' own runtime dirs stay.
func TestRestartStopsPrelaunchedVMMs(t *testing.T) {
	e := newEnv(t)
	e.create("x")
	rd := e.state.Run("_pre-x-1f")
	e.restartStops(standIn(t, rd), "the prelaunched process")
	if dirExists(rd.Path()) {
		t.Fatalf("%s is still there after the restart", rd.Path())
	}
	if !dirExists(e.state.Run("x").Path()) {
		t.Fatal("the restart's sweep removed a running VM's runtime dir")
	}
	e.wantState("x", registry.StateRunning)
}

// TestRemoveWithCorruptSpec: a VM whose recorded spec does not decode can
// still be removed (every other operation refuses it, saying so).
func TestRemoveWithCorruptSpec(t *testing.T) {
	e := newEnv(t)
	db := e.reg
	ctx := ctxT(t)
	e.create("bad")
	if _, err := db.UpdateVM(ctx, "bad", func(v *registry.VM) error {
		v.SpecJSON = `{"kernel": `
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Sleep(ctx, "bad", false); err == nil || !strings.Contains(err.Error(), "corrupt spec") {
		t.Fatalf("sleep with a corrupt spec: %v; want it refused, saying so", err)
	}
	if err := e.m.Remove(ctx, "bad", true); err != nil {
		t.Fatalf("rm with a corrupt spec: %v", err)
	}
	if _, err := db.GetVM(ctx, "bad"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("record after rm: %v; want none", err)
	}
	if live := e.drv.Live(); live != 0 {
		t.Fatalf("%d vmms left running after rm", live)
	}
}
