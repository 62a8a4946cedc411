package machine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// reconcile matches the registry against reality after a (re)start:
// running VMs are adopted or, when their VMM is gone, marked stopped with
// the reason; half-created or half-deleted VMs are rolled back or
// finished.
func (m *Manager) reconcile(ctx context.Context) error {
	vms, err := m.db.ListVMs(ctx, "")
	if err != nil {
		return err
	}
	for _, vm := range vms {
		if vm.State != registry.StateCreating && vm.State != registry.StateDeleting {
			m.sweepCheckpoints(ctx, vm.Name)
			m.sweepSuspend(ctx, vm)
			m.sealPending(ctx, vm)
		}
		switch vm.State {
		case registry.StateRunning:
			m.adopt(ctx, vm)
		case registry.StateSleeping, registry.StateStopped:
			m.strayVMM(ctx, vm)
		case registry.StateCreating:
			m.log.Warn("den: rolling back a vm whose creation was interrupted", "vm", vm.Name)
			m.destroy(ctx, vm.Name)
			m.rollBackAutoCheckpoint(ctx, vm)
			_ = m.db.DeleteCheckpoints(ctx, vm.Name)
			_ = m.db.DeleteVM(ctx, vm.Name)
		case registry.StateDeleting:
			m.destroy(ctx, vm.Name)
			_ = os.RemoveAll(m.state.Run(vm.Name).Path())
			_ = m.db.DeleteCheckpoints(ctx, vm.Name)
			_ = m.db.DeleteVM(ctx, vm.Name)
		}
	}
	m.sweepPrelaunched()
	m.ram.sweep(vms, func(n string) bool { return m.instance(n) != nil }, m.log)
	return nil
}

// adopt re-attaches to a running VM's VMM, or records that it is gone.
// A VMM that holds its disk on a volume mount that died while den was
// not running (heldOnLostMount) is killed and the VM recorded stopped:
// a VM never runs on a dead disk, across a restart either.
func (m *Manager) adopt(ctx context.Context, vm registry.VM) {
	rd := m.state.Run(vm.Name)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := m.driver(vm.VMM)
	var hv vmm.Hypervisor
	if err == nil {
		hv, err = d.Adopt(actx, rd)
	}
	if err != nil {
		m.recordStopped(ctx, vm.Name, fmt.Sprintf("vmm gone while den was not running: %v", err))
		m.stopRecorded(vm.Name)
		return
	}
	if held := m.heldOnLostMount(hv); len(held) > 0 {
		m.log.Warn("den: stopping a vm: its vmm holds its disk on a volume mount that died while den was not running", "vm", vm.Name, "held", held)
		_ = hv.Discard(actx)
		m.recordStopped(ctx, vm.Name, m.lostWhileDown(ctx, vm.Name, held))
		m.stopRecorded(vm.Name)
		return
	}
	in := newInstance(vm.Name, hv)
	in.adopted(vm.LastActive)
	// den never leaves a VM paused between operations: one found paused
	// was caught by a crash in the middle of a checkpoint or sleep.
	if info, err := hv.Info(actx); err == nil && info.State == vmm.StatePaused {
		m.log.Warn("den: resuming a vm left paused by an interrupted operation", "vm", vm.Name)
		if err := hv.Resume(actx); err != nil {
			m.log.Warn("den: resume", "vm", vm.Name, "err", err)
		}
	}
	in.reopen() // its record says running
	m.setInstance(in)
	go m.watch(in)
}

// strayVMM deals with a VMM a crash left running for a VM whose record
// does not say running. A sleeping VM's running guest is a wake cut short
// after the guest ran: it is the newest state, so it is adopted and the
// record says running (unless its disk is on a lost mount: stopped). A sleeping VM's paused guest is a sleep cut short
// after its slot was written: it is stopped. A stopped VM's VMM (a boot,
// or a restore to be finished) is stopped: it must not run beside the
// next one on the same disk.
func (m *Manager) strayVMM(ctx context.Context, vm registry.VM) {
	rd := m.state.Run(vm.Name)
	if _, err := vmm.AdoptProcess(rd.PIDFile()); err != nil {
		return
	}
	if vm.State == registry.StateSleeping {
		if d, err := m.driver(vm.VMM); err == nil {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			hv, err := d.Adopt(actx, rd)
			if err == nil {
				info, ierr := hv.Info(actx)
				running := ierr == nil && info.State == vmm.StateRunning
				if held := m.heldOnLostMount(hv); running && len(held) > 0 {
					// Its guest ran on a dead disk, which its slot's
					// memory no longer matches: it boots from the disk.
					m.log.Warn("den: stopping a vm: its vmm holds its disk on a volume mount that died while den was not running", "vm", vm.Name, "held", held)
					_ = hv.Discard(actx)
					m.recordStopped(ctx, vm.Name, m.lostWhileDown(ctx, vm.Name, held))
				} else if running {
					cancel()
					if _, err := m.db.UpdateVMIf(ctx, vm.Name, vm.Generation, func(v *registry.VM) error {
						v.State, v.Reason = registry.StateRunning, ""
						return nil
					}); err == nil {
						m.log.Warn("den: adopting a vm whose wake was cut short after its guest ran", "vm", vm.Name)
						in := newInstance(vm.Name, hv)
						in.reopen()
						m.setInstance(in)
						go m.watch(in)
						return
					}
				}
				_ = hv.Shutdown(actx)
			}
			cancel()
		}
	}
	if p, err := vmm.AdoptProcess(rd.PIDFile()); err == nil {
		m.log.Warn("den: stopping a vmm left by an interrupted operation", "vm", vm.Name, "state", vm.State, "pid", p.PID())
		_ = p.Stop(10 * time.Second)
	}
	m.discardRuntime(vm.Name)
}

// sweepClones removes the clones a crash cut short in vm's directory (a
// restore's staged disk, a disk cloned over the VM's). Their names are
// no volume paths (they begin with a dot), so they go by host path.
func (m *Manager) sweepClones(vm string) {
	dir, err := m.vol.Path(storage.VMDir(vm))
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
func (m *Manager) sweepSuspend(ctx context.Context, vm registry.VM) {
	m.removeRetired(vm.Name)
	_ = m.vol.Remove(ctx, restoreStage(vm.Name))
	m.sweepClones(vm.Name)
	tmp, err := m.vol.Path(suspendNew(vm.Name))
	if err != nil {
		return
	}
	if _, err := os.Stat(tmp); err != nil {
		return
	}
	slot, _ := m.vol.Path(storage.SuspendDir(vm.Name))
	if _, err := os.Stat(slot); vm.State == registry.StateSleeping && err != nil {
		if err := m.swapSuspend(ctx, vm.Name); err != nil {
			m.log.Warn("den: finish suspend", "vm", vm.Name, "err", err)
		}
		m.removeRetired(vm.Name)
		return
	}
	_ = m.vol.Remove(ctx, suspendNew(vm.Name))
}

// stopRecorded kills a VMM that its PID file names but that den could
// not adopt (it does not answer): it must not run on unsupervised.
func (m *Manager) stopRecorded(name string) {
	stopPIDFile(m.state.Run(name))
	m.discardRuntime(name)
}

// watch waits for the VMM to exit and, unless den stopped it, has the
// VM's owner record it: under the VM's lock, once any operation in
// flight is done, and only if this instance is still the VM's.
func (m *Manager) watch(in *instance) {
	select {
	case <-in.hv.Exited():
	case <-m.closed:
		return
	}
	select {
	case <-in.stopping:
		return // den stopped it and records the new state itself
	case <-m.closed:
		return
	default:
	}
	reason := exitReason(in) + consoleHint(m.state.Run(in.name))
	m.log.Warn("den: vm stopped unexpectedly", "vm", in.name, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultLockWait)
	defer cancel()
	unlock, err := m.lockVM(ctx, in.name, "reconcile")
	if err != nil {
		m.log.Warn("den: record stopped vm (the next read will)", "vm", in.name, "err", err)
		return
	}
	defer unlock()
	select {
	case <-in.stopping:
		return // an operation stopped it meanwhile and recorded it
	default:
	}
	if m.instance(in.name) != in {
		return // an operation replaced it (restore, wake)
	}
	in.closeAgent()
	m.dropInstanceIf(in)
	m.conf.drop(in.name)
	m.recordStopped(ctx, in.name, reason)
}

// recordStopped records a running (or creating, sleeping) VM as stopped
// with the reason; the caller owns the VM (holds its lock, or is the
// start-up reconcile).
func (m *Manager) recordStopped(ctx context.Context, name, reason string) {
	_, err := m.db.UpdateVM(context.WithoutCancel(ctx), name, func(v *registry.VM) error {
		if v.State == registry.StateStopped || v.State == registry.StateDeleting {
			return nil
		}
		v.State = registry.StateStopped
		v.Reason = reason
		return nil
	})
	if err != nil {
		m.log.Warn("den: record stopped vm", "vm", name, "err", err)
	}
}

// destroy stops whatever VMM a VM has and removes its disk, checkpoints
// and runtime files. Best effort: used for rollback and deletion.
func (m *Manager) destroy(ctx context.Context, name string) {
	if in := m.instance(name); in != nil {
		m.stopInstance(ctx, in, stopQuit)
	} else {
		m.stopRecorded(name)
	}
	if err := m.vol.Remove(ctx, storage.VMDir(name)); err != nil {
		m.log.Warn("den: remove vm files", "vm", name, "err", err)
	}
	m.net.down(ctx, name)
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
func (m *Manager) stopInstance(ctx context.Context, in *instance, how stopHow) {
	select {
	case <-in.stopping:
	default:
		close(in.stopping)
	}
	if how == stopGraceful {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c, err := m.agentClient(gctx, in); err == nil {
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
		m.log.Warn("den: stop vmm", "vm", in.name, "err", err)
	}
	m.dropInstance(in.name)
	end = phase.Begin(ctx, "remove runtime files")
	m.discardRuntime(in.name)
	end()
}

func decodeSpec(vm registry.VM) (spec, error) {
	var sp spec
	if err := json.Unmarshal([]byte(vm.SpecJSON), &sp); err != nil {
		return sp, fmt.Errorf("vm %q: corrupt spec: %w", vm.Name, err)
	}
	return sp, nil
}
