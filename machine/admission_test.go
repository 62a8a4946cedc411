//go:build linux

package machine_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// The admission tests count 128 MiB guests with a 32 MiB VMM overhead:
// 160 MiB a VM, and a budget of 350 MiB fits two.
const (
	admGuest    = 128 << 20
	admOverhead = 32 << 20
	admPerVM    = admGuest + admOverhead
	admBudget   = 350 << 20
)

// newMemEnv is newEnv with a memory config; the pressure watcher is off
// unless mc sets an interval. Every fake guest gets a /proc/stat, so that
// its agent answers activity requests as a real one does.
func newMemEnv(t *testing.T, mc machine.MemoryConfig) *env {
	t.Helper()
	e := newEnv(t)
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if mc.PressureInterval == 0 {
		mc.PressureInterval = -1
	}
	e.cfg.Memory = mc
	e.drv.Hook = func(op, rundir string) {
		if op == "boot" || op == "restore" {
			_ = os.MkdirAll(filepath.Join(rundir, "guest-proc"), 0o755)
			_ = os.WriteFile(filepath.Join(rundir, "guest-proc", "stat"), []byte("cpu  10 0 10 1000 0 0 0 0\ncpu0 10 0 10 1000 0 0 0 0\n"), 0o644)
		}
	}
	e.open()
	return e
}

// createVM makes a running VM of admGuest that may sleep (idle timeout
// 1h) unless pinned (idle timeout 0: never sleeps).
func (e *env) createVM(name string, pinned bool) (registry.VM, error) {
	idle := time.Hour
	if pinned {
		idle = 0
	}
	return e.m.Create(ctxT(e.t), machine.CreateOptions{Name: name, MemoryBytes: admGuest, DiskBytes: imageSize,
		IdleTimeout: idle, Cold: true}, nil)
}

func (e *env) mustCreateVM(name string, pinned bool) {
	e.t.Helper()
	if _, err := e.createVM(name, pinned); err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
}

// touch makes a VM the most recently active: a session opened and ended.
func (e *env) touch(name string) {
	e.t.Helper()
	s, err := e.m.Open(ctxT(e.t), name, "")
	if err != nil {
		e.t.Fatalf("open %s: %v", name, err)
	}
	s.Release()
}

func TestAdmissionSleepsLeastRecentlyActive(t *testing.T) {
	e := newMemEnv(t, machine.MemoryConfig{Budget: admBudget, VMMOverhead: admOverhead})
	e.mustCreateVM("a", false)
	e.mustCreateVM("b", false)
	e.touch("a") // b is now the least recently active
	memB := e.memory("b")
	if st := e.m.Memory(ctxT(t)); st.Committed != 2*admPerVM || st.Running != 2 || st.Free != admBudget-2*admPerVM {
		t.Fatalf("memory with two vms: %+v", st)
	}

	// A third does not fit: b goes to sleep, the create goes ahead.
	e.mustCreateVM("c", false)
	e.wantState("b", registry.StateSleeping)
	e.wantState("a", registry.StateRunning)
	e.wantState("c", registry.StateRunning)
	if n := e.drv.Live(); n != 2 {
		t.Fatalf("%d vmms run, want 2", n)
	}
	if st := e.m.Memory(ctxT(t)); st.Committed != 2*admPerVM || st.Running != 2 || st.Starting != 0 {
		t.Fatalf("memory after the third create: %+v", st)
	}

	// Waking b makes room the same way: a is now the least recently
	// active (c was created after a's session), and b has its memory.
	e.touch("b")
	e.wantState("b", registry.StateRunning)
	e.wantState("a", registry.StateSleeping)
	e.wantState("c", registry.StateRunning)
	if got := e.memory("b"); got != memB {
		t.Fatalf("b woke with memory %q, want %q", got, memB)
	}
}

func TestAdmissionRefusesWhenNothingCanSleep(t *testing.T) {
	e := newMemEnv(t, machine.MemoryConfig{Budget: admBudget, VMMOverhead: admOverhead})
	e.mustCreateVM("a", false)
	e.mustCreateVM("b", true) // never sleeps
	s, err := e.m.Open(ctxT(t), "a", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()

	_, err = e.createVM("c", false)
	if !errors.Is(err, machine.ErrNoMemory) {
		t.Fatalf("create over the budget: %v, want ErrNoMemory", err)
	}
	want := fmt.Sprintf("not enough memory: 160 MiB needed, %d MiB free in the budget; running VMs that cannot sleep: a (1 session(s) open), b (never sleeps: idle timeout 0)",
		(admBudget-2*admPerVM)>>20)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("refusal:\n got %q\nwant %q", err, want)
	}
	// Nothing is left half-made, and nothing stays reserved.
	if _, err := e.m.Record(ctxT(t), "c"); !errors.Is(err, machine.ErrNotFound) {
		t.Fatalf("record of the refused vm: %v", err)
	}
	if p, _ := e.vol.Path(storage.VMDir("c")); dirExists(p) {
		t.Fatalf("the refused vm left %s", p)
	}
	if n := e.drv.Live(); n != 2 {
		t.Fatalf("%d vmms run, want 2", n)
	}
	if st := e.m.Memory(ctxT(t)); st.Committed != 2*admPerVM || st.Starting != 0 {
		t.Fatalf("memory after the refusal: %+v", st)
	}
	e.wantState("a", registry.StateRunning)
	e.wantState("b", registry.StateRunning)

	// Once a's session ends, a can sleep, and the create goes ahead.
	s.Release()
	e.mustCreateVM("c", false)
	e.wantState("a", registry.StateSleeping)
	e.wantState("b", registry.StateRunning)
	e.wantState("c", registry.StateRunning)

	// A VM larger than the whole budget is refused at once.
	_, err = e.m.Create(ctxT(t), machine.CreateOptions{Name: "big", MemoryBytes: 512 << 20, DiskBytes: imageSize, IdleTimeout: time.Hour, Cold: true}, nil)
	if !errors.Is(err, machine.ErrNoMemory) || !strings.Contains(err.Error(), "more than the whole budget") {
		t.Fatalf("create larger than the budget: %v", err)
	}
	e.wantState("c", registry.StateRunning)
}

// TestAdmissionConcurrentCreatesNeverOvercommit starts creates at once:
// at no moment do more VMMs run than the budget holds, whether the VMs
// can be put to sleep (idle) or not (pinned).
func TestAdmissionConcurrentCreatesNeverOvercommit(t *testing.T) {
	for _, pinned := range []bool{true, false} {
		t.Run(fmt.Sprintf("pinned=%v", pinned), func(t *testing.T) {
			e := newMemEnv(t, machine.MemoryConfig{Budget: admBudget, VMMOverhead: admOverhead})
			var maxLive atomic.Int64
			prev := e.drv.Hook
			e.drv.Hook = func(op, rundir string) {
				prev(op, rundir)
				if op == "boot" || op == "restore" {
					n := int64(e.drv.Live())
					for {
						cur := maxLive.Load()
						if n <= cur || maxLive.CompareAndSwap(cur, n) {
							break
						}
					}
				}
			}
			const n = 5
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					_, errs[i] = e.createVM(fmt.Sprintf("c%d", i), pinned)
				})
			}
			wg.Wait()
			ok := 0
			for i, err := range errs {
				switch {
				case err == nil:
					ok++
				case errors.Is(err, machine.ErrNoMemory):
					if _, rerr := e.m.Record(ctxT(t), fmt.Sprintf("c%d", i)); !errors.Is(rerr, machine.ErrNotFound) {
						t.Errorf("refused c%d left a record: %v", i, rerr)
					}
				default:
					t.Errorf("create c%d: %v", i, err)
				}
			}
			if got := maxLive.Load(); got > 2 {
				t.Fatalf("%d vmms ran at once; the budget holds 2", got)
			}
			if live := e.drv.Live(); live > 2 {
				t.Fatalf("%d vmms run; the budget holds 2", live)
			}
			if st := e.m.Memory(ctxT(t)); st.Committed > admBudget || st.Starting != 0 {
				t.Fatalf("memory after concurrent creates: %+v", st)
			}
			if pinned && ok != 2 {
				t.Fatalf("%d pinned creates succeeded, want 2 (errors: %v)", ok, errs)
			}
			if !pinned && ok < 2 {
				t.Fatalf("%d idle creates succeeded, want at least 2 (errors: %v)", ok, errs)
			}
		})
	}
}

// TestPressureSleepsLeastRecentlyActive: a pressure source reporting
// pressure while more than one VM runs puts the least recently active to
// sleep, then the next, and stops once pressure falls.
func TestPressureSleepsLeastRecentlyActive(t *testing.T) {
	for _, kind := range []string{"psi", "memavailable"} {
		t.Run(kind, func(t *testing.T) {
			var on atomic.Bool
			var calls atomic.Int64
			var e *env
			var eMu sync.Mutex
			src := func() (machine.Pressure, error) {
				calls.Add(1)
				eMu.Lock()
				env := e
				eMu.Unlock()
				calm := machine.Pressure{SomeAvg10: 0.5, Available: 8 << 30, Total: 16 << 30}
				if !on.Load() || env == nil || env.drv.Live() <= 1 {
					return calm, nil
				}
				if kind == "psi" {
					return machine.Pressure{SomeAvg10: 42, Available: 8 << 30, Total: 16 << 30}, nil
				}
				return machine.Pressure{SomeAvg10: -1, Available: 100 << 20, Total: 16 << 30}, nil
			}
			mc := machine.MemoryConfig{Budget: -1, Pressure: src, PressureInterval: 5 * time.Millisecond,
				PressureCooldown: 5 * time.Millisecond, MinAvailable: 1 << 30}
			env := newMemEnv(t, mc)
			eMu.Lock()
			e = env
			eMu.Unlock()
			var slept []string
			var sleptMu sync.Mutex
			prev := env.drv.Hook
			env.drv.Hook = func(op, rundir string) {
				prev(op, rundir)
				if op == "snapshot" {
					sleptMu.Lock()
					slept = append(slept, filepath.Base(rundir))
					sleptMu.Unlock()
				}
			}
			env.mustCreateVM("a", false)
			env.mustCreateVM("b", false)
			env.mustCreateVM("c", false)
			env.touch("a") // least recently active first: b, c, a

			on.Store(true)
			testutil.WaitForWithin(t, testTimeout, "b and c asleep", func() bool {
				return env.record("b").State == registry.StateSleeping && env.record("c").State == registry.StateSleeping
			})
			// Pressure has fallen (one VM runs): the watcher reads it
			// many more times and puts nothing more to sleep.
			after := calls.Load()
			testutil.WaitForWithin(t, testTimeout, "more pressure readings", func() bool { return calls.Load() >= after+20 })
			env.wantState("a", registry.StateRunning)
			sleptMu.Lock()
			defer sleptMu.Unlock()
			if strings.Join(slept, ",") != "b,c" {
				t.Fatalf("pressure put %v to sleep, want b then c", slept)
			}
		})
	}
}

func TestParseMemoryAmount(t *testing.T) {
	const total = 16 << 30
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"75%", 12 << 30, true},
		{"100%", total, true},
		{"12G", 12 << 30, true},
		{"512M", 512 << 20, true},
		{"off", -1, true},
		{"0%", 0, false},
		{"150%", 0, false},
		{"-1G", 0, false},
		{"lots", 0, false},
	} {
		got, err := machine.ParseMemoryAmount(c.in, total)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseMemoryAmount(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
	if b := machine.DefaultBudget(total); b != total*80/100 {
		t.Errorf("default budget of 16 GiB: %d", b)
	}
	if b := machine.DefaultBudget(2 << 30); b != 1<<30 {
		t.Errorf("default budget of 2 GiB leaves the host 1 GiB: got %d", b)
	}
}
