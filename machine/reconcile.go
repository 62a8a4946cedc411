package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// reconcile matches the registry against reality after a (re)start:
// half-created or half-deleted VMs are rolled back or finished first, one
// at a time (a fork's rollback touches its source); then the others,
// reconcileWorkers at a time (each waits mostly on the volume: a host
// with a thousand sleeping VMs starts in a fraction of the time), have
// what a crash left of their operations swept and, when recorded
// running, their VMM adopted or, when it is gone, are marked stopped with
// the reason.
func (su *startup) reconcile(ctx context.Context) error {
	endStep := phase.Begin(ctx, StartStep+"claim")
	claimed, err := su.claim(ctx)
	endStep()
	if err != nil {
		return err
	}
	defer func() {
		defer phase.Begin(ctx, StartStep+"let go")()
		unlocks := make([]func(), 0, len(claimed))
		for _, unlock := range claimed {
			unlocks = append(unlocks, unlock)
		}
		inParallel(unlocks, reconcileWorkers, func(unlock func()) { unlock() })
	}()
	defer phase.Begin(ctx, StartStep+"reconcile")()
	vms, err := su.m.db.ListVMs(ctx, "")
	if err != nil {
		return err
	}
	if claimed != nil {
		vms = slices.DeleteFunc(vms, func(vm registry.VM) bool { return claimed[vm.Name] == nil })
	}
	var rest []registry.VM
	for _, vm := range vms {
		switch vm.State {
		case registry.StateCreating, registry.StateDeleting:
			if vm.State == registry.StateCreating {
				su.m.log.Warn("den: rolling back a vm whose creation was interrupted", "vm", vm.Name)
			}
			_ = su.dropUnfinished(ctx, vm)
		default:
			rest = append(rest, vm)
		}
	}
	endStep = phase.Begin(ctx, StartStep+"sweep")
	inParallel(rest, reconcileWorkers, func(vm registry.VM) { su.reconcileVM(ctx, vm) })
	endStep()
	su.sweepPrelaunched()
	su.m.ram.sweep(vms, func(n string) bool { return su.m.procs.instance(n) != nil }, su.m.log)
	return nil
}

// claim takes, on a cluster host, the lock and lease of each VM this
// host may have left something of, for reconcile, which then looks at
// those alone: a VM whose lease names this host (held, or let lapse: a
// VMM of this host's, an operation, or the digests of a snapshot cut
// short or failed), whose VMM's PID file is here (it may run), or that
// is half created or removed. A VM whose lease was given back has
// nothing of this host's in flight: an operation gives it back once
// done, and once its snapshots' digests are written. A VM another host holds is that host's
// to reconcile; a VMM of it still running here (its fence failed to stop
// it) is stopped: never two VMMs on one disk. It returns the claimed
// VMs' unlocks (nil on a host of its own: every VM is this host's).
func (su *startup) claim(ctx context.Context) (map[string]func(), error) {
	if su.m.cfg.Leases == nil {
		return nil, nil
	}
	vms, err := su.m.db.ListVMs(ctx, "")
	if err != nil {
		return nil, err
	}
	mine, err := su.m.cfg.Leases.Mine(ctx)
	if err != nil {
		return nil, err
	}
	named := make(map[string]bool, len(mine))
	for _, l := range mine {
		named[l.VM] = true
	}
	vms = slices.DeleteFunc(vms, func(vm registry.VM) bool {
		if named[vm.Name] || vm.State == registry.StateCreating || vm.State == registry.StateDeleting {
			return false
		}
		_, err := os.Stat(su.m.state.Run(vm.Name).PIDFile())
		return err != nil
	})
	claimed := map[string]func(){}
	var mu sync.Mutex
	inParallel(vms, reconcileWorkers, func(vm registry.VM) {
		unlock, err := su.m.locks.lockName(ctx, vm.Name, "start-up")
		if err != nil {
			su.m.log.Info("den: start-up: a vm is another host's", "vm", vm.Name, "err", err)
			if held := (*HeldError)(nil); errors.As(err, &held) && held.Host != su.m.cfg.HostName {
				su.strayElsewhere(vm.Name, held.Host)
			}
			return
		}
		mu.Lock()
		claimed[vm.Name] = unlock
		mu.Unlock()
	})
	return claimed, nil
}

// inParallel calls fn on each item, workers at a time, and returns when
// all calls have.
func inParallel[T any](items []T, workers int, fn func(T)) {
	todo := make(chan T)
	var wg sync.WaitGroup
	for range min(workers, len(items)) {
		wg.Go(func() {
			for it := range todo {
				fn(it)
			}
		})
	}
	for _, it := range items {
		todo <- it
	}
	close(todo)
	wg.Wait()
}

// dropUnfinished finishes a VM whose creation (rolled back) or removal
// was cut short: its VMM, files, checkpoints and record go.
func (su *startup) dropUnfinished(ctx context.Context, vm registry.VM) error {
	su.m.procs.destroy(ctx, vm.Name)
	if vm.State == registry.StateCreating {
		su.rollBackAutoCheckpoint(ctx, vm)
	}
	_ = os.RemoveAll(su.m.state.Run(vm.Name).Path())
	if err := su.m.db.DeleteCheckpoints(ctx, vm.Name); err != nil {
		return err
	}
	if err := su.m.db.DeleteVM(ctx, vm.Name); err != nil && !errors.Is(err, registry.ErrNotFound) {
		return err
	}
	return nil
}

// reconcileWorkers bounds the VMs reconcile looks at at once (claims,
// sweeps, unlocks: each waits mostly on the registry or the volume).
const reconcileWorkers = 4

// reconcileVM sweeps what a crash left of one VM's operations and adopts
// its VMM, or records it gone.
func (su *startup) reconcileVM(ctx context.Context, vm registry.VM) {
	su.sweepCheckpoints(ctx, vm.Name)
	su.sweepSuspend(ctx, vm)
	su.m.integrity.sealPending(ctx, vm)
	// The sweeps, and a fork's rollback before them, may have written
	// the record since it was listed.
	if fresh, err := su.m.db.GetVM(ctx, vm.Name); err == nil {
		vm = fresh
	}
	switch vm.State {
	case registry.StateRunning:
		su.adopt(ctx, vm)
	case registry.StateSleeping, registry.StateStopped, registry.StateLost:
		su.strayVMM(ctx, vm)
	}
}

// adopt re-attaches to a running VM's VMM, or records that it is gone.
// A VMM that holds its disk on a volume mount that died while den was
// not running (heldOnLostMount) is killed and the VM recorded stopped:
// a VM never runs on a dead disk, across a restart either.
func (su *startup) adopt(ctx context.Context, vm registry.VM) {
	rd := su.m.state.Run(vm.Name)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := su.m.vmms.driver(vm.VMM)
	var hv vmm.Hypervisor
	if err == nil {
		hv, err = d.Adopt(actx, rd)
	}
	if err != nil {
		su.m.procs.recordStopped(ctx, vm.Name, fmt.Sprintf("vmm gone while den was not running: %v", err))
		su.m.procs.stopRecorded(vm.Name)
		return
	}
	if held := su.m.guard.heldOnLostMount(hv); len(held) > 0 {
		su.m.log.Warn("den: stopping a vm: its vmm holds its disk on a volume mount that died while den was not running", "vm", vm.Name, "held", held)
		_ = hv.Discard(actx)
		su.m.procs.recordStopped(ctx, vm.Name, su.m.guard.lostWhileDown(ctx, vm.Name, held))
		su.m.procs.stopRecorded(vm.Name)
		return
	}
	in := newInstance(vm.Name, vm.VMM, hv)
	in.adopted(vm.LastActive)
	// den never leaves a VM paused between operations: one found paused
	// was caught by a crash in the middle of a checkpoint or sleep.
	if info, err := hv.Info(actx); err == nil && info.State == vmm.StatePaused {
		su.m.log.Warn("den: resuming a vm left paused by an interrupted operation", "vm", vm.Name)
		if err := hv.Resume(actx); err != nil {
			su.m.log.Warn("den: resume", "vm", vm.Name, "err", err)
		}
	}
	in.reopen() // its record says running
	su.m.procs.setInstance(in)
	go su.m.procs.watch(in)
}

// strayVMM deals with a VMM a crash left running for a VM whose record
// does not say running. A sleeping VM's running guest is a wake cut short
// after the guest ran: it is the newest state, so it is adopted and the
// record says running (unless its disk is on a lost mount: stopped). A sleeping VM's paused guest is a sleep cut short
// after its slot was written: it is stopped. A stopped VM's VMM (a boot,
// or a restore to be finished) is stopped: it must not run beside the
// next one on the same disk.
func (su *startup) strayVMM(ctx context.Context, vm registry.VM) {
	rd := su.m.state.Run(vm.Name)
	if _, err := vmm.AdoptProcess(rd.PIDFile()); err != nil {
		return
	}
	if vm.State == registry.StateSleeping {
		if d, err := su.m.vmms.driver(vm.VMM); err == nil {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			hv, err := d.Adopt(actx, rd)
			if err == nil {
				info, ierr := hv.Info(actx)
				running := ierr == nil && info.State == vmm.StateRunning
				if held := su.m.guard.heldOnLostMount(hv); running && len(held) > 0 {
					// Its guest ran on a dead disk, which its slot's
					// memory no longer matches: it boots from the disk.
					su.m.log.Warn("den: stopping a vm: its vmm holds its disk on a volume mount that died while den was not running", "vm", vm.Name, "held", held)
					_ = hv.Discard(actx)
					su.m.procs.recordStopped(ctx, vm.Name, su.m.guard.lostWhileDown(ctx, vm.Name, held))
				} else if running {
					cancel()
					if _, err := su.m.db.UpdateVMIf(ctx, vm.Name, vm.Generation, func(v *registry.VM) error {
						v.State, v.Reason = registry.StateRunning, ""
						return nil
					}); err == nil {
						su.m.log.Warn("den: adopting a vm whose wake was cut short after its guest ran", "vm", vm.Name)
						in := newInstance(vm.Name, vm.VMM, hv)
						in.reopen()
						su.m.procs.setInstance(in)
						go su.m.procs.watch(in)
						return
					}
				}
				_ = hv.Shutdown(actx)
			}
			cancel()
		}
	}
	su.stopLeft(vm.Name, "den: stopping a vmm left by an interrupted operation", "state", vm.State)
}

// strayElsewhere stops a VMM left running here for a VM that host holds.
func (su *startup) strayElsewhere(name, host string) {
	if _, err := vmm.AdoptProcess(su.m.state.Run(name).PIDFile()); err == nil {
		su.stopLeft(name, "den: stopping a vmm of a vm another host holds", "host", host)
	}
}

// stopLeft stops the VMM a crash or a failed fence left running for
// name, if it still runs, saying why (with attrs), and removes name's
// runtime files (they are this host's alone).
func (su *startup) stopLeft(name, why string, attrs ...any) {
	if p, err := vmm.AdoptProcess(su.m.state.Run(name).PIDFile()); err == nil {
		su.m.log.Warn(why, append([]any{"vm", name, "pid", p.PID()}, attrs...)...)
		_ = p.Stop(10 * time.Second)
	}
	su.m.launch.discardRuntime(name)
}

// sweepClones removes the clones a crash cut short in vm's directory (a
// restore's staged disk, a disk cloned over the VM's). Their names are
// no volume paths (they begin with a dot), so they go by host path.
func (su *startup) sweepClones(vm string) {
	dir, err := su.m.vol.Path(storage.VMDir(vm))
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if storage.IsCloneTemp(e.Name()) {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// sweepSuspend finishes or drops a suspend snapshot a crash interrupted:
// a sleeping VM whose slot swap was cut short gets the new snapshot; any
// other leftover is removed, with a retired slot whose removal was cut
// short and a disk a restore staged but did not put in place (a restore
// finished later clones its own).
func (su *startup) sweepSuspend(ctx context.Context, vm registry.VM) {
	su.m.snaps.removeRetired(vm.Name)
	_ = su.m.vol.Remove(ctx, restoreStage(vm.Name))
	su.sweepClones(vm.Name)
	tmp, err := su.m.vol.Path(suspendNew(vm.Name))
	if err != nil {
		return
	}
	if _, err := os.Stat(tmp); err != nil {
		return
	}
	slot, _ := su.m.vol.Path(storage.SuspendDir(vm.Name))
	if _, err := os.Stat(slot); vm.State == registry.StateSleeping && err != nil {
		if err := su.m.snaps.swapSuspend(ctx, vm.Name); err != nil {
			su.m.log.Warn("den: finish suspend", "vm", vm.Name, "err", err)
		}
		su.m.snaps.removeRetired(vm.Name)
		return
	}
	_ = su.m.vol.Remove(ctx, suspendNew(vm.Name))
}

// stopRecorded kills a VMM that its PID file names but that den could
// not adopt (it does not answer): it must not run on unsupervised.
func (pr *procs) stopRecorded(name string) {
	stopPIDFile(pr.m.state.Run(name))
	pr.m.launch.discardRuntime(name)
}

// watch waits for the VMM to exit and, unless den stopped it, has the
// VM's owner record it: under the VM's lock, once any operation in
// flight is done, and only if this instance is still the VM's.
func (pr *procs) watch(in *instance) {
	select {
	case <-in.hv.Exited():
	case <-pr.m.closed:
		return
	}
	select {
	case <-in.stopping:
		return // den stopped it and records the new state itself
	case <-pr.m.closed:
		return
	default:
	}
	reason := exitReason(in) + consoleHint(pr.m.state.Run(in.name))
	pr.m.log.Warn("den: vm stopped unexpectedly", "vm", in.name, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultLockWait)
	defer cancel()
	unlock, err := pr.m.locks.lockVM(ctx, in.name, "reconcile")
	if err != nil {
		pr.m.log.Warn("den: record stopped vm (the next read will)", "vm", in.name, "err", err)
		return
	}
	defer unlock()
	select {
	case <-in.stopping:
		return // an operation stopped it meanwhile and recorded it
	default:
	}
	if pr.instance(in.name) != in {
		return // an operation replaced it (restore, wake)
	}
	in.closeAgent()
	pr.dropInstanceIf(in)
	pr.m.conf.drop(in.name)
	pr.recordStopped(ctx, in.name, reason)
}

// recordStopped records a running (or creating, sleeping) VM as stopped
// with the reason; the caller owns the VM (holds its lock, or is the
// start-up reconcile).
func (pr *procs) recordStopped(ctx context.Context, name, reason string) {
	_, err := pr.m.db.UpdateVM(context.WithoutCancel(ctx), name, func(v *registry.VM) error {
		if v.State == registry.StateStopped || v.State == registry.StateDeleting || v.State == registry.StateLost {
			return nil
		}
		v.State = registry.StateStopped
		v.Reason = reason
		return nil
	})
	if err != nil {
		pr.m.log.Warn("den: record stopped vm", "vm", name, "err", err)
	}
}

// destroy stops whatever VMM a VM has and removes its disk, checkpoints
// and runtime files. Best effort: used for rollback and deletion.
func (pr *procs) destroy(ctx context.Context, name string) {
	if in := pr.instance(name); in != nil {
		pr.stopInstance(ctx, in, stopQuit)
	} else {
		pr.stopRecorded(name)
	}
	if err := pr.m.vol.Remove(ctx, storage.VMDir(name)); err != nil {
		pr.m.log.Warn("den: remove vm files", "vm", name, "err", err)
	}
	pr.m.records.forget(name)
	pr.m.net.down(ctx, name)
}

// stopHow says how stopInstance stops a VMM.
type stopHow int

const (
	// stopQuit has the VMM quit: its devices flush, the guest gets no
	// notice.
	stopQuit stopHow = iota
	// stopGraceful asks the guest's agent to power off first (so the
	// guest unmounts its disk), then quits the VMM.
	stopGraceful
	// stopDiscard kills the VMM: for a VM whose running state and disk
	// writes are thrown away (a restore replaces them).
	stopDiscard
)

// stopInstance stops a VM's VMM as how says and removes its runtime
// files.
func (pr *procs) stopInstance(ctx context.Context, in *instance, how stopHow) {
	select {
	case <-in.stopping:
	default:
		close(in.stopping)
	}
	if how == stopGraceful {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c, err := pr.m.agents.agentClient(gctx, in); err == nil {
			if c.Poweroff(gctx) == nil {
				select {
				case <-in.hv.Exited():
				case <-gctx.Done():
				}
			}
		}
		cancel()
	}
	end := phase.Begin(ctx, "close the agent connection")
	in.closeAgent()
	end()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	if how == stopDiscard {
		end = phase.Begin(ctx, "vmm kill")
		err = in.hv.Discard(sctx)
	} else {
		end = phase.Begin(ctx, "vmm shutdown")
		err = in.hv.Shutdown(sctx)
	}
	end()
	if err != nil {
		pr.m.log.Warn("den: stop vmm", "vm", in.name, "err", err)
	}
	pr.dropInstance(in.name)
	end = phase.Begin(ctx, "remove runtime files")
	pr.m.launch.discardRuntime(in.name)
	end()
}

func decodeSpec(vm registry.VM) (spec, error) {
	var sp spec
	if err := json.Unmarshal([]byte(vm.SpecJSON), &sp); err != nil {
		return sp, fmt.Errorf("vm %q: corrupt spec: %w", vm.Name, err)
	}
	return sp, nil
}

// StartStep begins the names of the steps of a start that New times
// (phase) under its context: the daemon logs them.
const StartStep = "start-up: "

// startup finds, when den starts, what the last daemon left: VMMs to
// adopt, records to reconcile, half-made clones, slots and checkpoints to
// sweep (reconcile.go).
type startup struct{ m *Manager }
