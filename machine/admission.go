package machine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/registry"
)

// Memory admission: den counts the guest RAM it has committed (every VM
// whose VMM runs or is starting, plus a VMM's own overhead each) against
// a budget. Starting a VMM (boot, restoreInto: create, wake, restore,
// fork) that would go over it first puts the least recently active idle
// VMs to sleep, through the normal sleep path, and fails with a line
// naming the VMs that cannot sleep only when none can. Admissions are one
// at a time, and a VM's memory stays reserved while its VMM starts, so
// two starts never both count the same free memory.
//
// What can sleep is decided as the idle monitor decides what is idle: no
// session through den, none on the guest agent, no keep-awake lease, and
// an idle timeout (a VM with none never sleeps on den's own account). A
// guest busy with its CPU counts as active: the idle monitor touches it
// every pass, so it comes last in the order.

// ErrNoMemory: starting the VM would go over the memory budget and no
// running VM could be put to sleep to make room.
var ErrNoMemory = errors.New("not enough memory")

// DefaultVMMOverhead is what a VMM process takes beside its guest's RAM,
// for the memory budget: QEMU under TCG, whose translated code and heap
// grow with the code a guest runs, not with its RAM (docs/benchmarks.md,
// "Constants set from measurements"). KVM and Cloud Hypervisor need less:
// den daemon --vmm-overhead sets it.
const DefaultVMMOverhead = 128 << 20

// Defaults of the memory budget and the pressure watcher.
const (
	// DefaultBudgetPercent of the host's MemTotal is the default budget,
	// but at most MemTotal less DefaultHostReserve.
	DefaultBudgetPercent = 80
	DefaultHostReserve   = 1 << 30
	// DefaultPressureSome is the PSI "some avg10" (percent of the last
	// 10 s some task stalled on memory) at which the host is under
	// pressure.
	DefaultPressureSome = 10.0
	// DefaultMinAvailablePercent of MemTotal: less MemAvailable is
	// pressure.
	DefaultMinAvailablePercent = 5
	DefaultPressureInterval    = 2 * time.Second
	// DefaultPressureCooldown is the least time between two sleeps for
	// pressure: PSI's avg10 needs a few seconds to show the relief.
	DefaultPressureCooldown = 20 * time.Second
)

// MemoryConfig configures memory admission and the pressure watcher.
type MemoryConfig struct {
	// Budget is the guest RAM, plus VMMOverhead per VM, that den keeps
	// committed at most. 0: DefaultBudget of the host; < 0: no budget.
	Budget int64
	// VMMOverhead per running VM (0: DefaultVMMOverhead).
	VMMOverhead int64
	// Pressure reads the host's memory pressure (nil: HostPressure).
	Pressure PressureSource
	// PressureSome is the PSI "some avg10" (percent) at or above which
	// the host is under pressure (0: DefaultPressureSome; < 0: ignored).
	PressureSome float64
	// MinAvailable is the MemAvailable under which the host is under
	// pressure (0: DefaultMinAvailablePercent of MemTotal; < 0: ignored).
	MinAvailable int64
	// PressureInterval is how often pressure is read (0:
	// DefaultPressureInterval; < 0: no pressure watcher).
	PressureInterval time.Duration
	// PressureCooldown is the least time between two pressure sleeps
	// (0: DefaultPressureCooldown).
	PressureCooldown time.Duration
}

// DefaultBudget is the budget of a host with total bytes of RAM: 80% of
// it, leaving the host at least 1 GiB.
func DefaultBudget(total int64) int64 {
	b := total * DefaultBudgetPercent / 100
	if r := total - DefaultHostReserve; r < b {
		b = r
	}
	return max(b, 0)
}

// ParseMemoryAmount reads a budget or threshold: a percentage of the
// host's RAM ("75%"), a size ("12G", internal/size), or "off" (-1).
func ParseMemoryAmount(s string, total int64) (int64, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "off") {
		return -1, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, fmt.Errorf("bad memory amount %q: a percentage of the host's RAM is more than 0%% and at most 100%%", s)
		}
		if total <= 0 {
			return 0, fmt.Errorf("bad memory amount %q: the host's RAM is unknown, give a size", s)
		}
		return int64(float64(total) * f / 100), nil
	}
	b, err := size.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("%w, or a percentage of the host's RAM (75%%), or off", err)
	}
	return b, nil
}

// admission is the Manager's memory account.
type admission struct {
	budget   int64 // < 0: none
	overhead int64
	sem      chan struct{} // one admission (or pressure sleep) at a time

	mu       sync.Mutex
	reserved map[string]int64 // VMs whose VMM is starting, and what they need
}

func (mb *memoryBudget) newAdmission() *admission {
	c := mb.m.cfg.Memory
	a := &admission{budget: c.Budget, overhead: c.VMMOverhead, sem: make(chan struct{}, 1), reserved: map[string]int64{}}
	if a.overhead <= 0 {
		a.overhead = DefaultVMMOverhead
	}
	if a.budget == 0 {
		total, _, err := hostMeminfo()
		if err != nil {
			mb.m.log.Warn("den: host memory unknown: no memory budget", "err", err)
			a.budget = -1
		} else {
			a.budget = DefaultBudget(total)
		}
	}
	if a.budget > 0 {
		if total, _, err := hostMeminfo(); err == nil && a.budget > total {
			mb.m.log.Warn("den: the memory budget is more than the host's RAM: guests that touch their memory may meet the OOM killer",
				"budget", size.Format(a.budget), "host", size.Format(total))
		}
	}
	return a
}

// acquire takes the admission turn, waiting at most until ctx ends or
// the lock wait passes.
func (mb *memoryBudget) acquireAdmission(ctx context.Context) error {
	wait := mb.m.cfg.LockWait
	if wait <= 0 {
		wait = DefaultLockWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case mb.m.adm.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for memory admission: %w", errors.Join(ErrBusy, ctx.Err()))
	case <-clientGone(ctx):
		return fmt.Errorf("wait for memory admission: the client went away: %w", ErrBusy)
	case <-t.C:
		return fmt.Errorf("wait for memory admission: another start or sleep took longer than %s: %w", wait, ErrBusy)
	case <-mb.m.closed:
		return fmt.Errorf("wait for memory admission: %w", errClosing)
	}
}

func (mb *memoryBudget) releaseAdmission() { <-mb.m.adm.sem }

// admitMemory reserves the memory vm's VMM needs before it starts,
// putting the least recently active idle VMs to sleep when the budget
// has no room; release gives the reservation back (once the VMM runs it
// counts as running, and if it failed nothing counts). The caller holds
// vm's lock.
func (mb *memoryBudget) admitMemory(ctx context.Context, vm registry.VM) (release func(), err error) {
	a := mb.m.adm
	if a == nil || a.budget < 0 {
		return func() {}, nil
	}
	need := vm.MemoryBytes + a.overhead
	if need > a.budget {
		return nil, &noMemoryError{fmt.Sprintf("not enough memory: %s needed, more than the whole budget of %s (den daemon --memory-budget)",
			fmtMem(need), fmtMem(a.budget))}
	}
	if err := mb.acquireAdmission(ctx); err != nil {
		return nil, fmt.Errorf("start vm %q: %w", vm.Name, err)
	}
	defer mb.releaseAdmission()
	cannot := map[string]string{}
	// Each pass either fits, or puts a VM to sleep (one fewer running:
	// nothing else starts a VMM while the turn is held), or refuses.
	for range 1000 {
		use := mb.memoryUse(ctx, vm.Name)
		if use.committed+need <= a.budget {
			a.mu.Lock()
			a.reserved[vm.Name] = need
			a.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					a.mu.Lock()
					delete(a.reserved, vm.Name)
					a.mu.Unlock()
				})
			}, nil
		}
		free := a.budget - use.committed
		why := fmt.Sprintf("vm %q needs %s, %s free in the memory budget", vm.Name, fmtMem(need), fmtMem(free))
		if _, ok := mb.sleepOne(ctx, use.running, cannot, why); !ok {
			return nil, noMemory(need, free, use.running, cannot)
		}
	}
	return nil, fmt.Errorf("start vm %q: memory admission did not settle: %w", vm.Name, ErrBusy)
}

// noMemoryError is a refusal for memory: its message is the line the
// user reads, and it is ErrNoMemory.
type noMemoryError struct{ msg string }

func (e *noMemoryError) Error() string { return e.msg }
func (e *noMemoryError) Unwrap() error { return ErrNoMemory }

// noMemory is the refusal line: `not enough memory: 7.5 GiB needed, 2.1
// GiB free in the budget; running VMs that cannot sleep: a (keep-awake
// lease held), b (1 session open)`.
func noMemory(need, free int64, running []runningVM, cannot map[string]string) error {
	var names []string
	for _, r := range running {
		why := cannot[r.name]
		if why == "" {
			why = "busy"
		}
		names = append(names, r.name+" ("+why+")")
	}
	sort.Strings(names)
	msg := fmt.Sprintf("not enough memory: %s needed, %s free in the budget; ", fmtMem(need), fmtMem(free))
	if len(names) == 0 {
		msg += "no other VM is running"
	} else {
		msg += "running VMs that cannot sleep: " + strings.Join(names, ", ")
	}
	return &noMemoryError{msg}
}

// fmtMem prints memory for people: 7.5 GiB, 224 MiB.
func fmtMem(b int64) string {
	if b < 0 {
		b = 0
	}
	if b >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", b>>20)
}

// runningVM is a VM whose VMM counts against the budget.
type runningVM struct {
	name       string
	bytes      int64 // its guest RAM plus the VMM overhead
	vm         registry.VM
	in         *instance // nil while it starts
	lastActive time.Time
	starting   bool
}

// memoryUsage is what is committed, without one VM (the one starting).
type memoryUsage struct {
	committed int64
	running   []runningVM // least recently active first
}

// memoryUse counts the VMs with a live VMM or a reservation, except
// skip.
func (mb *memoryBudget) memoryUse(ctx context.Context, skip string) memoryUsage {
	a := mb.m.adm
	mb.m.mu.Lock()
	live := map[string]*instance{}
	for name, in := range mb.m.instances {
		if alive(in) {
			live[name] = in
		}
	}
	mb.m.mu.Unlock()
	a.mu.Lock()
	reserved := make(map[string]int64, len(a.reserved))
	for name, n := range a.reserved {
		reserved[name] = n
	}
	a.mu.Unlock()
	records := map[string]registry.VM{}
	if vms, err := mb.m.db.ListVMs(ctx, ""); err == nil {
		for _, vm := range vms {
			records[vm.Name] = vm
		}
	} else {
		mb.m.log.Warn("den: memory admission: list vms", "err", err)
	}
	var u memoryUsage
	for name, n := range reserved {
		if name == skip {
			continue
		}
		u.committed += n
		u.running = append(u.running, runningVM{name: name, bytes: n, vm: records[name], starting: true})
	}
	for name, in := range live {
		if name == skip {
			continue
		}
		if _, ok := reserved[name]; ok {
			continue
		}
		vm := records[name]
		r := runningVM{name: name, bytes: vm.MemoryBytes + a.overhead, vm: vm, in: in}
		_, r.lastActive = in.activity()
		if vm.LastActive.After(r.lastActive) {
			r.lastActive = vm.LastActive
		}
		u.committed += r.bytes
		u.running = append(u.running, r)
	}
	sort.Slice(u.running, func(i, j int) bool {
		ri, rj := u.running[i], u.running[j]
		if !ri.lastActive.Equal(rj.lastActive) {
			return ri.lastActive.Before(rj.lastActive)
		}
		return ri.name < rj.name
	})
	return u
}

// sleepOne puts the least recently active VM of running that can sleep
// to sleep, for reason; those that cannot are noted in cannot, with why,
// and not tried again.
func (mb *memoryBudget) sleepOne(ctx context.Context, running []runningVM, cannot map[string]string, reason string) (string, bool) {
	for _, r := range running {
		if _, tried := cannot[r.name]; tried {
			continue
		}
		if why := mb.trySleepForMemory(ctx, r, reason); why != "" {
			cannot[r.name] = why
			continue
		}
		return r.name, true
	}
	return "", false
}

// trySleepForMemory puts one VM to sleep through the normal sleep path,
// unless it cannot sleep now; it says why not ("" when it slept). The
// VM's lock is only tried, never waited for: an admission holds its own
// VM's lock, and two admissions must never wait for each other.
func (mb *memoryBudget) trySleepForMemory(ctx context.Context, r runningVM, reason string) string {
	if r.starting || r.in == nil {
		return "starting"
	}
	if r.vm.Name == "" {
		return "no record"
	}
	if r.vm.IdleTimeout <= 0 {
		return "never sleeps: idle timeout 0"
	}
	if n, _ := r.in.activity(); n > 0 {
		return fmt.Sprintf("%d session(s) open", n)
	}
	unlock, err := mb.m.locks.tryLockVM(r.name, "sleep for memory")
	if err != nil {
		return err.Error()
	}
	if unlock == nil {
		op, _ := mb.m.Op(r.name)
		if op == "" {
			return "busy"
		}
		return "busy: " + op
	}
	if unlock, err = mb.m.locks.leased(ctx, r.name, unlock); err != nil {
		return err.Error()
	}
	o, err := mb.m.holding(ctx, r.name, "sleep for memory", unlock)
	if err != nil {
		return err.Error()
	}
	in := o.instance()
	if in == nil || !alive(in) || !in.isOpen() {
		o.end(nil)
		return "not running"
	}
	if why := mb.whyAwake(ctx, in); why != "" {
		o.end(nil)
		return why
	}
	idle := time.Since(r.lastActive).Round(time.Second)
	mb.m.log.Info("den: putting vm to sleep to free memory", "vm", r.name, "reason", reason,
		"frees", fmtMem(r.bytes), "idle", idle)
	err = o.sleep(ctx, false)
	o.end(err)
	if err != nil {
		mb.m.log.Warn("den: sleep to free memory", "vm", r.name, "err", err)
		if errors.Is(err, ErrConflict) {
			return "busy: " + err.Error()
		}
		return "sleep failed: " + err.Error()
	}
	mb.m.log.Info("den: vm asleep to free memory", "vm", r.name, "reason", reason, "freed", fmtMem(r.bytes))
	return ""
}

// whyAwake asks the guest agent, as the idle monitor does, whether
// anything in the guest keeps it awake: a keep-awake lease, a session or
// a forward on the agent. A guest that does not answer is not put to
// sleep on a guess.
func (mb *memoryBudget) whyAwake(ctx context.Context, in *instance) string {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := mb.m.agents.agentClient(actx, in)
	if err != nil {
		return "its guest agent does not answer"
	}
	a, err := c.Activity(actx)
	if err != nil {
		return "its guest agent does not answer"
	}
	switch {
	case a.Held(time.Now()):
		return "keep-awake lease held"
	case a.Sessions+a.Forwards > 0:
		return fmt.Sprintf("%d session(s) open in the guest", a.Sessions+a.Forwards)
	}
	return ""
}

// MemoryStatus is the memory budget and its use, for den info and den
// doctor.
type MemoryStatus struct {
	// Budget is what den commits at most (< 0: no budget).
	Budget int64
	// Committed is the guest RAM plus VMM overhead of running and
	// starting VMs; Free what the budget has left.
	Committed, Free int64
	// Running VMs, and Starting ones (their memory is reserved).
	Running, Starting int
	VMMOverhead       int64
	// HostTotal and HostAvailable are /proc/meminfo's MemTotal and
	// MemAvailable, PressureSome PSI's memory "some avg10" (< 0 where
	// unknown).
	HostTotal, HostAvailable int64
	PressureSome             float64
}

// Memory reports the budget and its use now.
func (m *Manager) Memory(ctx context.Context) MemoryStatus {
	u := m.budget.memoryUse(ctx, "")
	st := MemoryStatus{Budget: m.adm.budget, Committed: u.committed, VMMOverhead: m.adm.overhead,
		HostTotal: -1, HostAvailable: -1, PressureSome: -1}
	for _, r := range u.running {
		if r.starting {
			st.Starting++
		} else {
			st.Running++
		}
	}
	if st.Budget >= 0 {
		st.Free = max(st.Budget-st.Committed, 0)
	}
	if total, avail, err := hostMeminfo(); err == nil {
		st.HostTotal, st.HostAvailable = total, avail
	}
	if some, err := readPSISome(psiMemory); err == nil {
		st.PressureSome = some
	}
	return st
}

// memoryBudget admits VMMs within the host's memory, and puts idle VMs to
// sleep to make room or under pressure (admission.go, pressure.go).
type memoryBudget struct{ m *Manager }
