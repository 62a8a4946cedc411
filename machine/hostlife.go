package machine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// The host's life: a shutdown and the boot after it.
//
// VMMs outlive a daemon restart, but not a host shutdown: the system kills
// them. SleepAll with Shutdown puts every running VM to sleep first (in
// parallel, within a bound) and marks each in the registry
// (registry.VM.WakeOnBoot); the next Manager wakes the marked VMs in the
// background (startBootWake, most recently active first), so a reboot
// costs each VM a wake, not its processes. A VM that cannot be put to
// sleep in time is stopped by den itself and recorded so, with what was
// lost and its last checkpoint. A daemon restart alone marks nothing and
// leaves VMs running.

// Defaults of HostOptions and of the boot wake.
const (
	// DefaultHostTimeout bounds SleepAll and WakeAll as a whole.
	DefaultHostTimeout = 2 * time.Minute
	// DefaultHostParallel is how many VMs SleepAll and WakeAll handle at
	// once: a sleep mostly writes the guest's memory to the volume.
	DefaultHostParallel = 4
	// DefaultBootWakeParallel is how many VMs the boot wake wakes at once.
	DefaultBootWakeParallel = 2
	// bootWakeTimeout bounds the boot wake as a whole; each wake is also
	// bounded by its own steps.
	bootWakeTimeout = 30 * time.Minute
	// maxStopReserve caps the part of a shutdown's bound kept for stopping
	// and recording the VMs that did not sleep in time.
	maxStopReserve = 20 * time.Second
)

// HostOptions configures SleepAll and WakeAll.
type HostOptions struct {
	// Shutdown says the host is going down (SleepAll only): the VMs put
	// to sleep are marked to be woken when den next starts; a VM that
	// cannot sleep within the bound is stopped and recorded with what was
	// lost; sessions do not hold a VM awake; and afterwards den refuses
	// new work (nothing may wake a VM before the VMMs are killed) until
	// it restarts.
	Shutdown bool
	// Timeout bounds the whole call (default DefaultHostTimeout). In
	// SleepAll, sleeps must end before its last quarter (at most 20 s),
	// which is kept for the sleeps cut short to end and, with Shutdown,
	// for stopping and recording the VMs that did not sleep.
	Timeout time.Duration
	// Parallel is how many VMs are handled at once (default
	// DefaultHostParallel).
	Parallel int
	// Force puts VMs with sessions open to sleep (always so with
	// Shutdown).
	Force bool

	// marked makes WakeAll wake only the VMs a shutdown marked (the boot
	// wake), and clear their marks.
	marked bool
}

// WithDefaults fills in the zero Timeout and Parallel.
func (o HostOptions) WithDefaults() HostOptions {
	if o.Timeout <= 0 {
		o.Timeout = DefaultHostTimeout
	}
	if o.Parallel <= 0 {
		o.Parallel = DefaultHostParallel
	}
	return o
}

// stopReserve is the part of a shutdown's bound kept for stopping and
// recording the VMs whose sleep did not finish.
func stopReserve(timeout time.Duration) time.Duration {
	return min(timeout/4, maxStopReserve)
}

// HostResult is what became of one VM in SleepAll or WakeAll.
type HostResult struct {
	Name string
	// State and Reason are the VM's record afterwards ("" if unread).
	State  registry.State
	Reason string
	Took   time.Duration
	// Err is nil when the VM was put to sleep (woken), or was already.
	Err error

	// skip: a VM a shutdown waited for (an operation held it) that did
	// not end up running: nothing to report.
	skip bool
}

// errHostDown refuses new work from the moment a host shutdown begins
// until den restarts: a VM woken, started or created now would lose its
// processes when the host kills the VMMs, and would not be marked to
// wake at the next start.
var errHostDown = fmt.Errorf("the host is shutting down (den sleep --all --shutdown): den takes no new work until it restarts: %w", ErrConflict)

// opHostSleep is what holds a VM that a shutdown puts to sleep.
const opHostSleep = "sleep (host shutdown)"

// duringShutdown are the operations admitted once a host shutdown
// began: its own, and those that only record or stop a VM.
var duringShutdown = map[string]bool{
	opHostSleep:              true,
	"reconcile":              true,
	"stop after volume loss": true,
	"stop a vm restored from a damaged snapshot": true,
}

// hostRefusesLocked refuses an operation taking a VM's lock once a host
// shutdown began (unless it is one of duringShutdown); the caller holds
// m.mu, under which beginHostDown takes its list of the VMs held.
func (h *hostLife) hostRefusesLocked(name, op string) error {
	if h.m.hostDown.Load() && !duringShutdown[op] {
		return fmt.Errorf("vm %q: %w", name, errHostDown)
	}
	return nil
}

// hostRefuses refuses a session (exec, ssh, a URL's request, a wake)
// once a host shutdown began, whether the VM runs or not.
func (h *hostLife) hostRefuses(name string) error {
	if h.m.hostDown.Load() {
		return fmt.Errorf("vm %q: %w", name, errHostDown)
	}
	return nil
}

// beginHostDown makes the Manager refuse new work (hostRefusesLocked,
// hostRefuses) and returns the VMs an operation holds at that moment:
// work in flight, which the shutdown waits for and then accounts for.
func (h *hostLife) beginHostDown() map[string]bool {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	h.m.hostDown.Store(true)
	held := map[string]bool{}
	for name, h := range h.m.holders {
		if h.op != opHostSleep {
			held[name] = true
		}
	}
	return held
}

// reasonAsleep is the reason of a VM a shutdown put to sleep.
const reasonAsleep = "asleep for a host shutdown: den wakes it when it next starts"

// SleepAll puts every running VM to sleep, the most recently active
// first, o.Parallel at a time, within o.Timeout; report (if not nil)
// receives each VM's result as it comes. Per-VM failures are in the
// results; the error is for failing to start at all. See HostOptions for
// what Shutdown adds.
func (m *Manager) SleepAll(ctx context.Context, o HostOptions, report func(HostResult)) ([]HostResult, error) {
	o = o.WithDefaults()
	start := time.Now()
	hard, cancelHard := context.WithTimeout(ctx, o.Timeout)
	defer cancelHard()
	soft, cancelSoft := context.WithTimeout(hard, o.Timeout-stopReserve(o.Timeout))
	defer cancelSoft()
	held := &heldLocks{}
	var inFlight map[string]bool
	if o.Shutdown {
		// Whatever happens, den then refuses everything: the host is
		// going down, and a VM woken now would lose its processes.
		defer func() {
			m.host.refuseNew()
			held.release()
		}()
		// From here on no new work is admitted (no exec, wake, create,
		// restore...), and the operations under way are waited for
		// below: a VM one of them wakes or makes is put to sleep too.
		inFlight = m.host.beginHostDown()
		// A boot wake still under way (a reboot soon after a boot)
		// starts no more wakes, and the VMs it is waking are running
		// before the list below is read.
		waitGroup(soft, &m.hostWG)
	}
	vms, err := m.db.ListVMs(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("sleep all vms: %w", err)
	}
	var todo []registry.VM
	wasRunning := map[string]bool{}
	for _, vm := range vms {
		if vm.State == registry.StateRunning && (m.cfg.Leases == nil || m.procs.instance(vm.Name) != nil) {
			// (A cluster's other hosts run the VMs this one does not.)
			todo = append(todo, vm)
			wasRunning[vm.Name] = true
		}
	}
	// The VMs an operation held when the shutdown began (a wake, a
	// create...), whatever their record said: each is looked at once
	// that operation lets go.
	listed := map[string]bool{}
	for _, vm := range vms {
		listed[vm.Name] = true
		if inFlight[vm.Name] && !wasRunning[vm.Name] {
			todo = append(todo, vm)
		}
	}
	for name := range inFlight {
		if !listed[name] {
			todo = append(todo, registry.VM{Name: name})
		}
	}
	byActivity(todo)
	if o.Shutdown {
		m.log.Info("den: host shutting down: putting the running vms to sleep", "vms", len(todo), "timeout", o.Timeout, "parallel", o.Parallel)
	}
	results := make(chan HostResult, len(todo))
	sem := make(chan struct{}, o.Parallel)
	go func() {
		for _, vm := range todo {
			slot := false
			select {
			case sem <- struct{}{}:
				slot = true
			case <-soft.Done():
			}
			late := soft.Err() != nil
			go func() {
				if slot {
					defer func() { <-sem }()
				}
				results <- m.host.sleepForHost(soft, hard, vm, o, late, !wasRunning[vm.Name], held)
			}()
		}
	}()
	out := collect(hard, todo, results, report, func(vm registry.VM) HostResult {
		return HostResult{Name: vm.Name, Took: time.Since(start),
			Err: fmt.Errorf("vm %q: still being put to sleep when the %s bound ran out: %w", vm.Name, o.Timeout, ErrBusy)}
	})
	if o.Shutdown {
		var asleep []string
		var failed []string
		for _, r := range out {
			if r.Err == nil {
				asleep = append(asleep, r.Name)
			} else {
				failed = append(failed, r.Name)
			}
		}
		m.log.Info("den: host shutdown: vms put to sleep", "asleep", len(asleep), "failed", failed, "took", time.Since(start).Round(time.Millisecond))
		// The boot wake restores only memory it can check: the digests
		// of the slots just written are waited for (bounded), before
		// den closes and stops writing them.
		m.host.waitSealed(hard, asleep)
	}
	return out, nil
}

// waitSealed waits until the suspend slots of vms have the digests of
// their memory, or until ctx ends; a slot left without them is logged
// (the boot wake then leaves its VM asleep: see sealPending).
func (h *hostLife) waitSealed(ctx context.Context, vms []string) {
	if h.m.cfg.NoDigests || len(vms) == 0 {
		return
	}
	start := time.Now()
	busy := func() []string {
		var left []string
		for _, name := range vms {
			if h.m.seal.busy(storage.SuspendDir(name)) {
				left = append(left, name)
			}
		}
		return left
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		left := busy()
		if len(left) == 0 {
			h.m.log.Info("den: host shutdown: memory digests written", "vms", len(vms), "took", time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			h.m.log.Warn("den: host shutdown: out of time before the digests of these vms' memory were written: they are not woken at the next start", "vms", left)
			return
		case <-tick.C:
		}
	}
}

// collect gathers one result per VM of todo until all came or ctx ends;
// the VMs without a result by then get late's.
func collect(ctx context.Context, todo []registry.VM, results <-chan HostResult, report func(HostResult), late func(registry.VM) HostResult) []HostResult {
	if report == nil {
		report = func(HostResult) {}
	}
	var out []HostResult
	got := map[string]bool{}
	add := func(r HostResult) {
		got[r.Name] = true
		if r.skip {
			return
		}
		out = append(out, r)
		report(r)
	}
wait:
	for len(got) < len(todo) {
		select {
		case r := <-results:
			add(r)
		case <-ctx.Done():
			break wait
		}
	}
	for len(got) < len(todo) {
		select {
		case r := <-results:
			add(r)
			continue
		default:
		}
		break
	}
	for _, vm := range todo {
		if !got[vm.Name] {
			add(late(vm))
		}
	}
	return out
}

// sleepForHost puts one VM to sleep for SleepAll: its sleep must finish
// by soft; with Shutdown, a VM that did not (or that had no turn before
// soft: late) is stopped and recorded as lost by hard. inFlight: the VM
// was not running when the shutdown began, but an operation held it; it
// is put to sleep only if it runs once that operation let go.
func (h *hostLife) sleepForHost(soft, hard context.Context, vm registry.VM, o HostOptions, late, inFlight bool, held *heldLocks) HostResult {
	start := time.Now()
	bg := context.WithoutCancel(hard)
	done := func(err error) HostResult {
		r := HostResult{Name: vm.Name, Took: time.Since(start), Err: err}
		if rec, gerr := h.m.get(bg, vm.Name); gerr == nil {
			r.State, r.Reason = rec.State, rec.Reason
		}
		return r
	}
	if late && !o.Shutdown {
		return done(fmt.Errorf("vm %q: not put to sleep: the %s bound ran out before its turn: %w", vm.Name, o.Timeout, ErrBusy))
	}
	lockCtx, op := soft, "sleep --all"
	if o.Shutdown {
		// Operations under way are waited for until the end: a VM one
		// of them holds past soft is then stopped and recorded, not
		// left running unaccounted for.
		lockCtx, op = hard, opHostSleep
	}
	if late {
		lockCtx = hard
	}
	unlock, err := h.m.locks.lockVM(lockCtx, vm.Name, op)
	if err != nil {
		return done(err)
	}
	if o.Shutdown && soft.Err() != nil {
		late = true
	}
	if o.Shutdown {
		// Held until den refuses new work: nothing wakes it meanwhile.
		defer held.keep(unlock)
	} else {
		defer unlock()
	}
	vop, err := h.m.holding(hard, vm.Name, op, func() {}) // let go above
	if inFlight && (errors.Is(err, ErrNotFound) || (err == nil && vop.vm.State != registry.StateRunning)) {
		// The operation did not leave it running (a wake that failed,
		// a create rolled back, an rm): nothing to put to sleep.
		return HostResult{Name: vm.Name, skip: true}
	}
	if err != nil {
		return done(err)
	}
	cur := vop.vm
	switch {
	case cur.State == registry.StateSleeping:
		if o.Shutdown {
			h.markAsleep(bg, vm.Name)
		}
		return done(nil)
	case cur.State != registry.StateRunning:
		return done(fmt.Errorf("vm %q is %s, not running (%s): %w", vm.Name, cur.State, cur.Reason, ErrConflict))
	case late:
		return done(h.loseForHost(bg, vm.Name, fmt.Sprintf("no time was left for it within %s", o.Timeout)))
	}
	if o.Shutdown {
		// Marked before the sleep, so that a crash right after it still
		// wakes the VM at the next start; a failed sleep clears it.
		if err := vop.update(hard, func(v *registry.VM, _ *spec) error {
			v.WakeOnBoot = true
			return nil
		}); err != nil {
			return done(err)
		}
	}
	serr := h.sleepWithin(soft, bg, vop, o)
	if rec, err := h.m.get(bg, vm.Name); err == nil && rec.State == registry.StateSleeping {
		// Asleep (a sleep killed after its record was written finished).
		if o.Shutdown {
			h.markAsleep(bg, vm.Name)
		}
		return done(nil)
	}
	if !o.Shutdown {
		return done(serr)
	}
	cause := serr.Error()
	if soft.Err() != nil {
		cause = fmt.Sprintf("it did not sleep within %s: %v", (o.Timeout - stopReserve(o.Timeout)).Round(time.Millisecond), serr)
	}
	return done(h.loseForHost(bg, vm.Name, cause))
}

// sleepWithin puts the VM to sleep for the host, within soft: past it,
// on a shutdown, its VMM is killed, which ends the sleep (its VMM calls
// fail at once) and lets den record what was lost.
func (h *hostLife) sleepWithin(soft, bg context.Context, vop *op, o HostOptions) error {
	name := vop.name() // read here: the sleep writes vop's record
	errc := make(chan error, 1)
	go func() {
		err := vop.sleep(soft, o.Force || o.Shutdown)
		vop.finish(err)
		errc <- err
	}()
	select {
	case err := <-errc:
		return err
	case <-soft.Done():
	}
	if o.Shutdown {
		// Out of time: the host kills it soon anyway.
		h.m.log.Warn("den: host shutdown: a vm did not sleep in time; stopping its vmm", "vm", name)
		h.killVMM(bg, name)
	}
	return <-errc
}

// markAsleep makes a sleeping VM's record say that a shutdown put it to
// sleep and that the next start wakes it.
func (h *hostLife) markAsleep(ctx context.Context, name string) {
	_, err := h.m.db.UpdateVM(ctx, name, func(v *registry.VM) error {
		if v.State == registry.StateSleeping {
			v.WakeOnBoot, v.Reason = true, reasonAsleep
		}
		return nil
	})
	if err != nil {
		h.m.log.Warn("den: host shutdown: mark vm to wake at the next start", "vm", name, "err", err)
	}
}

// killVMM ends a VM's VMM at once (SIGTERM, SIGKILL a second later),
// whatever it is doing.
func (h *hostLife) killVMM(ctx context.Context, name string) {
	if p, err := vmm.AdoptProcess(h.m.state.Run(name).PIDFile()); err == nil {
		if err := p.Stop(time.Second); err != nil {
			h.m.log.Warn("den: kill vmm", "vm", name, "err", err)
		}
		return
	}
	if in := h.m.procs.instance(name); in != nil {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = in.hv.Shutdown(sctx)
	}
}

// loseForHost stops a VM that a shutdown could not put to sleep and
// records it stopped with what was lost; the caller holds its lock. The
// error says the same, for the VM's result. The VMM is stopped at once
// (QEMU flushes its disks as it exits): a guest that did not sleep in
// time is no more likely to power off in time, and the shutdown's bound
// is for all the VMs.
func (h *hostLife) loseForHost(ctx context.Context, name, cause string) error {
	if in := h.m.procs.instance(name); in != nil {
		in.close(true)
		h.killVMM(ctx, name) // a hung VMM answers no quit
		h.m.procs.stopInstance(ctx, in, stopQuit)
	} else {
		h.m.procs.stopRecorded(name)
	}
	reason := h.lostReason(ctx, name, cause)
	_, err := h.m.db.UpdateVM(ctx, name, func(v *registry.VM) error {
		if v.State == registry.StateDeleting {
			return nil
		}
		v.State, v.Reason, v.WakeOnBoot = registry.StateStopped, reason, false
		return nil
	})
	if err != nil {
		return fmt.Errorf("vm %q: %s (and recording it failed: %w)", name, reason, err)
	}
	h.m.log.Warn("den: host shutdown: a vm could not be put to sleep; its processes are lost", "vm", name, "reason", reason)
	return fmt.Errorf("vm %q: %s", name, reason)
}

// lostReason is the record's reason for a VM a shutdown could not put
// to sleep: what was lost, and what is left (the disk, and its last
// checkpoint).
func (h *hostLife) lostReason(ctx context.Context, name, cause string) string {
	s := "host shut down before it could sleep (" + cause + "): its processes are lost and it boots from its disk when next used"
	return s + h.lastCheckpoint(ctx, name, func(id, age string) string {
		return fmt.Sprintf("; last checkpoint %s, taken %s before the shutdown", id, age)
	})
}

// lastCheckpoint says what a restore of vm name can bring back, for a
// record's reason: "; it has no checkpoint", or its last checkpoint in
// the words of say (given its id and age), marked when disk only; ""
// when the catalog cannot be read.
func (h *hostLife) lastCheckpoint(ctx context.Context, name string, say func(id, age string) string) string {
	cps, err := h.m.db.ListCheckpoints(ctx, name)
	switch {
	case err != nil:
		return ""
	case len(cps) == 0:
		return "; it has no checkpoint"
	}
	c := cps[len(cps)-1]
	s := say(c.ID, roughly(time.Since(c.CreatedAt)))
	if c.Kind == checkpoint.KindDiskOnly {
		s += " (disk only)"
	}
	return s
}

// roughly is a duration as a person says it: 40s, 12m, 3h, 2d.
func roughly(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// WakeAll wakes every sleeping VM, the most recently active first,
// o.Parallel at a time, within o.Timeout; report (if not nil) receives
// each VM's result as it comes. Stopped VMs stay stopped. Per-VM
// failures are in the results; the error is for failing to start at all.
func (m *Manager) WakeAll(ctx context.Context, o HostOptions, report func(HostResult)) ([]HostResult, error) {
	o = o.WithDefaults()
	start := time.Now()
	vms, err := m.db.ListVMs(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("wake all vms: %w", err)
	}
	var todo []registry.VM
	for _, vm := range vms {
		if (o.marked && vm.WakeOnBoot) || (!o.marked && vm.State == registry.StateSleeping) {
			todo = append(todo, vm)
		}
	}
	byActivity(todo)
	hard, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	results := make(chan HostResult, len(todo))
	sem := make(chan struct{}, o.Parallel)
	go func() {
		// In order: the most recently active VMs wake first.
		for _, vm := range todo {
			select {
			case sem <- struct{}{}:
			case <-hard.Done():
				return // collect gives the rest their result
			}
			if o.marked && m.hostDown.Load() {
				<-sem
				results <- HostResult{Name: vm.Name, Err: fmt.Errorf("vm %q: not woken: the host is shutting down again; it stays marked for the next start: %w", vm.Name, errClosing)}
				continue
			}
			go func() {
				defer func() { <-sem }()
				results <- m.host.wakeForHost(hard, vm, o)
			}()
		}
	}()
	return collect(hard, todo, results, report, func(vm registry.VM) HostResult {
		return HostResult{Name: vm.Name, Took: time.Since(start),
			Err: fmt.Errorf("vm %q: not woken within %s: %w", vm.Name, o.Timeout, ErrBusy)}
	}), nil
}

// wakeForHost wakes one VM for WakeAll; for the boot wake it also clears
// the VM's mark, whatever happens.
func (h *hostLife) wakeForHost(ctx context.Context, vm registry.VM, o HostOptions) HostResult {
	start := time.Now()
	bg := context.WithoutCancel(ctx)
	r := HostResult{Name: vm.Name}
	op := "wake --all"
	if o.marked {
		op = "wake (host boot)"
	}
	r.Err = func() (err error) {
		wop, err := h.m.begin(ctx, vm.Name, op)
		if err != nil {
			return err
		}
		defer func() { wop.end(err) }()
		cur := wop.vm
		switch {
		case o.marked && !cur.WakeOnBoot:
			return nil // woken meanwhile (a session reached it first)
		case cur.State == registry.StateRunning:
			err = nil
		case cur.State == registry.StateSleeping:
			_, err = wop.run(ctx)
		default:
			err = fmt.Errorf("vm %q is %s, not sleeping: %w", vm.Name, cur.State, ErrConflict)
		}
		if rec, gerr := h.m.get(bg, vm.Name); o.marked && gerr == nil && rec.WakeOnBoot {
			// A wake that failed is not retried at every start: the
			// VM stays asleep and wakes when next used. (A wake that
			// worked cleared the mark with the state.)
			_, uerr := h.m.db.UpdateVM(bg, vm.Name, func(v *registry.VM) error {
				if !v.WakeOnBoot {
					return nil
				}
				v.WakeOnBoot = false
				if errors.Is(err, ErrDamaged) && v.State == registry.StateSleeping {
					v.Reason = fmt.Sprintf("den did not wake it when it started: %v", err)
				} else if err != nil && v.State == registry.StateSleeping {
					v.Reason = fmt.Sprintf("den could not wake it when it started (%v); it wakes when next used", err)
				} else if v.Reason == reasonAsleep {
					v.Reason = ""
				}
				return nil
			})
			if uerr != nil {
				h.m.log.Warn("den: clear a vm's wake-at-start mark", "vm", vm.Name, "err", uerr)
			}
		}
		return err
	}()
	r.Took = time.Since(start)
	if rec, err := h.m.get(bg, vm.Name); err == nil {
		r.State, r.Reason = rec.State, rec.Reason
	}
	return r
}

// startBootWake wakes, in the background, the VMs a host shutdown put to
// sleep (registry.VM.WakeOnBoot): the most recently active first,
// Config.BootWakeParallel at a time, logging each.
func (h *hostLife) startBootWake() {
	h.m.hostWG.Add(1)
	go func() {
		defer h.m.hostWG.Done()
		ctx := context.Background()
		vms, err := h.m.db.ListVMs(ctx, "")
		if err != nil {
			h.m.log.Warn("den: boot wake: list vms", "err", err)
			return
		}
		n := 0
		for _, vm := range vms {
			if vm.WakeOnBoot {
				n++
			}
		}
		if n == 0 {
			return
		}
		h.m.log.Info("den: waking the vms a host shutdown put to sleep", "vms", n)
		start := time.Now()
		par := h.m.cfg.BootWakeParallel
		if par <= 0 {
			par = DefaultBootWakeParallel
		}
		res, err := h.m.WakeAll(ctx, HostOptions{Timeout: bootWakeTimeout, Parallel: par, marked: true}, func(r HostResult) {
			if errors.Is(r.Err, errClosing) || errors.Is(r.Err, errHostDown) {
				h.m.log.Info("den: boot wake: vm left for the next start (den is stopping)", "vm", r.Name)
				return
			}
			if r.Err != nil {
				h.m.log.Warn("den: boot wake: vm not woken; it wakes when next used", "vm", r.Name, "state", r.State, "err", r.Err)
				return
			}
			h.m.log.Info("den: boot wake: vm woken", "vm", r.Name, "state", r.State, "took", r.Took.Round(time.Millisecond))
		})
		if err != nil {
			h.m.log.Warn("den: boot wake", "err", err)
			return
		}
		woken := 0
		for _, r := range res {
			if r.Err == nil {
				woken++
			}
		}
		h.m.log.Info("den: boot wake done", "woken", woken, "of", len(res), "took", time.Since(start).Round(time.Millisecond))
	}()
}

// waitGroup waits for wg, or until ctx ends.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// byActivity orders VMs the most recently active first.
func byActivity(vms []registry.VM) {
	sort.SliceStable(vms, func(i, j int) bool { return vms[i].LastActive.After(vms[j].LastActive) })
}

// refuseNew makes the Manager refuse new operations (as Close does
// first) without closing it.
func (h *hostLife) refuseNew() {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	select {
	case <-h.m.closed:
	default:
		close(h.m.closed)
	}
}

// heldLocks keeps VM locks that a shutdown holds until den refuses new
// work; a lock handed over after that is released at once.
type heldLocks struct {
	mu      sync.Mutex
	done    bool
	unlocks []func()
}

func (h *heldLocks) keep(unlock func()) {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		unlock()
		return
	}
	h.unlocks = append(h.unlocks, unlock)
	h.mu.Unlock()
}

func (h *heldLocks) release() {
	h.mu.Lock()
	h.done = true
	us := h.unlocks
	h.unlocks = nil
	h.mu.Unlock()
	for _, u := range us {
		u()
	}
}

// hostLife is den's side of the host's shutdown and boot: every VM put to
// sleep and marked, then woken when den starts again (hostlife.go).
type hostLife struct{ m *Manager }
