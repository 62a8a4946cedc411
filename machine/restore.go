package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// restoreSource is what restoreInto restores a VM from, and what it does
// beside.
type restoreSource struct {
	// snapDir is the VMM snapshot (a volume path).
	snapDir storage.Path
	// local, when set and still there once check passed, is a local
	// copy of the snapshot's memory the VMM reads instead of the
	// volume's (memcopy.go).
	local string
	// ram, when set, is the snapshot's memory being staged in a RAM file
	// (stage_ram.go), which the VMM takes if it was made whole, and the
	// VMM prelaunched on it, if any (prelaunch.go).
	ram *stagedRAM
	// check, when set, runs while the VMM starts (a verification of the
	// snapshot): the restore goes on only if it passes.
	check func(context.Context) error
	// disks, when set, is waited for before the VMM opens the VM's disk
	// (a clone still under way while the memory is read in).
	disks func() error
	// identity, when set, is the new identity the guest gets in its
	// agent's ready answer (a fork, a create from a warm base).
	identity *agent.IdentityRequest
}

// restoreInto starts a fresh VMM for vm from the snapshot src names, with
// the VM's own disk and sockets, and waits for its agent; the guest clock
// is set in the agent's ready answer, since it stopped when the snapshot
// was taken, and the new identity, if any, given after it.
func (o *op) restoreInto(ctx context.Context, src restoreSource) (_ *instance, err error) {
	m, vm, sp := o.m, o.vm, o.spec
	local, ram, check, disks := src.local, src.ram, src.check, src.disks
	checked := make(chan error, 1)
	if check == nil {
		checked <- nil
	} else {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel() // the check ends with a restore that failed early
		go func() {
			defer phase.Begin(cctx, "verify (beside the vmm's start)")()
			checked <- check(cctx)
		}()
	}
	cfg, err := m.launch.vmmConfig(vm, sp)
	if err != nil {
		return nil, err
	}
	dir, err := m.vol.Path(src.snapDir)
	if err != nil {
		return nil, err
	}
	if err := m.guard.needRAMSpace(vm, ram.allocated()); err != nil {
		return nil, err
	}
	end := phase.Begin(ctx, "admit memory")
	release, err := m.budget.admitMemory(ctx, vm)
	end()
	if err != nil {
		return nil, err
	}
	defer release()
	if disks, err = o.diskReady(ctx, disks); err != nil {
		return nil, err
	}
	end = phase.Begin(ctx, "network up")
	err = m.net.up(ctx, vm.Name, sp)
	end()
	if err != nil {
		return nil, err
	}
	end = phase.Begin(ctx, "start vmm")
	hv, opened, err := o.startVMM(ctx, ram, disks)
	end()
	if err != nil {
		return nil, err
	}
	in := newInstance(vm.Name, hv)
	if !opened.IsZero() {
		in.started = opened // the prelaunched VMM's disk is as old as that
	}
	// A failure from here stops the new VMM before the caller goes on:
	// this step's own rollback, done when it returns.
	started := cleanups{log: m.log}
	started.push("stop the new vmm", func() error {
		close(in.stopping)
		in.closeAgent()
		_ = hv.Shutdown(context.Background())
		m.launch.discardRuntime(vm.Name)
		return nil
	})
	defer func() {
		if err != nil {
			started.run()
		}
	}()
	end = phase.Begin(ctx, "wait for the verification")
	err = <-checked
	end()
	if err != nil {
		return nil, err
	}
	if local != "" {
		if _, err := os.Stat(local); err != nil {
			local = "" // dropped by the verification
		}
	}
	staged, waitStaged := ram.take()
	from := local // the local copy the RAM is read from, if any
	if staged != "" {
		from = ram.local
	}
	end = phase.Begin(ctx, "vmm restore")
	err = hv.Restore(ctx, dir, vmm.RestoreOptions{Resume: true, OnDemand: !m.cfg.RestoreCopy, Config: &cfg, DisksReady: disks,
		LocalMemory: local, StagedMemory: staged, WaitStaged: waitStaged})
	end()
	if err != nil {
		return nil, err
	}
	// From here the guest runs: a failure is one after it ran.
	if err := o.reconnect(ctx, in, src.identity); err != nil {
		return nil, fmt.Errorf("%w: %w", errGuestRan, err)
	}
	m.snaps.setOrigin(in, src.snapDir, from)
	m.procs.setInstance(in)
	go m.procs.watch(in)
	return in, nil
}

// diskReady is the wait for the VM's disk, which must be on a live
// volume: checked now, or, while it is still being cloned (cloned, if
// set, waits for that), once the clone is over.
func (o *op) diskReady(ctx context.Context, cloned func() error) (func() error, error) {
	waitDisk := func() error {
		defer phase.Begin(ctx, "wait for the volume")()
		return o.m.guard.waitDisk(ctx, o.name())
	}
	if cloned == nil {
		return nil, waitDisk()
	}
	return func() error {
		if err := cloned(); err != nil {
			return err
		}
		return waitDisk()
	}, nil
}

// startVMM starts the VM's VMM, empty, for a restore: the one prelaunched
// on the staged memory, if any, is taken as it is (opened is when it
// opened the VM's disk), else a new one is started in the VM's runtime
// dir and cgroup.
func (o *op) startVMM(ctx context.Context, ram *stagedRAM, disks func() error) (hv vmm.Hypervisor, opened time.Time, err error) {
	m, vm := o.m, o.vm
	rd := m.state.Run(vm.Name)
	m.launch.discardRuntime(vm.Name)
	if hv, opened = ram.prelaunched().take(ctx, vm, disks); hv != nil {
		return hv, opened, nil
	}
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return nil, opened, err
	}
	if err := m.conf.start(vm.Name, vm.CPUs, vm.MemoryBytes); err != nil {
		return nil, opened, err
	}
	if hv, err = m.vmms.newHypervisor(vm.VMM, rd); err != nil {
		return nil, opened, err
	}
	return hv, opened, hv.Start(ctx)
}

// reconnect waits for a restored guest's agent. The guest clock is
// stale: the agent's ready request sets it, and gives the guest its new
// identity, if any.
func (o *op) reconnect(ctx context.Context, in *instance, identity *agent.IdentityRequest) error {
	m := o.m
	opts := []agent.DialOption{agent.WithClockSet()}
	if identity != nil {
		opts = append(opts, agent.WithIdentity(*identity))
	}
	end := phase.Begin(ctx, "agent reconnect")
	info, err := m.agents.connectAgent(ctx, in, time.Minute, opts...)
	end()
	if err != nil {
		return err
	}
	switch {
	case info.ClockError != "":
		return fmt.Errorf("set guest clock: %s", info.ClockError)
	case info.Clock == nil: // an agent older than the clock in its ready request
		end = phase.Begin(ctx, "clock")
		c, err := m.agents.agentClient(ctx, in)
		if err == nil {
			_, err = c.SetClock(ctx, time.Now())
		}
		end()
		if err != nil {
			return fmt.Errorf("set guest clock: %w", err)
		}
	}
	if identity != nil {
		return m.agents.identityAnswered(ctx, in, info, *identity)
	}
	return nil
}

// meanwhile runs a volume operation (a disk clone) in the background,
// traced as step (unless "": op traces its own steps), with crash point
// after (if any) once it succeeded, and returns the wait for it: called
// any number of times, it returns the operation's error once it is over.
func (m *Manager) meanwhile(ctx context.Context, step, after string, op func() error) func() error {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		end := func() {}
		if step != "" {
			end = phase.Begin(ctx, step)
		}
		err = op()
		end()
		if err == nil && after != "" {
			crashpoint(after)
		}
	}()
	return func() error {
		<-done
		return err
	}
}

// errGuestRan marks a restore that failed after the restored guest ran.
var errGuestRan = errors.New("the restored guest ran")

// RestoreOptions tunes Restore.
type RestoreOptions struct {
	// NoSave skips checkpointing the current state first.
	NoSave bool
	// Force ends open sessions (exec, ssh) instead of refusing.
	Force bool
}

// Restore brings a VM back to a checkpoint: its disk, and for a
// memory+disk checkpoint its memory and processes. Unless NoSave, the
// current state is checkpointed first (a stopped VM's disk only), and its
// id returned. The current disk is replaced atomically only once the
// checkpoint's clone is whole.
func (m *Manager) Restore(ctx context.Context, name, id string, opts RestoreOptions, progress Progress) (saved string, err error) {
	if progress == nil {
		progress = func(string) {}
	}
	o, err := m.begin(ctx, name, "restore "+id)
	if err != nil {
		return "", err
	}
	defer func() { o.end(err) }()
	return o.restore(ctx, id, opts, progress)
}

// restore brings the VM back to checkpoint id.
func (o *op) restore(ctx context.Context, id string, opts RestoreOptions, progress Progress) (saved string, err error) {
	m, name, vm := o.m, o.name(), o.vm
	end := phase.Begin(ctx, "look up the checkpoint")
	cp, err := m.getCheckpoint(ctx, name, id)
	end()
	if err != nil {
		return "", err
	}
	// The checkpoint's memory is copied into a RAM file of its own, its
	// disk cloned beside the VM's and, with both, the new VMM started
	// beside the old while the checkpoint is verified, the current state
	// saved and the old VMM stopped: what is left for after is a rename
	// and the incoming migration.
	ram := m.snaps.stageRAM(ctx, vm, cp)
	defer ram.drop()
	staged := m.snaps.stageDisk(ctx, cp)
	defer staged.drop()
	in := o.instance()
	if ram != nil {
		ram.pre = m.prelaunch(ctx, vm, o.spec, in, ram, staged)
		defer ram.pre.drop() // before the staged disk's drop
	}
	// A damaged checkpoint is refused before anything changes. Its
	// memory is checked where the restore reads it: the local copy when
	// there is one (a damaged copy is dropped, the volume's checked).
	progress("verifying " + id)
	end = phase.Begin(ctx, "verify")
	err = m.integrity.verify(ctx, m.snaps.withLocalMemory(checkpointRef(cp), checkpointKey(cp.ID, cp.Seal)), vm.VMM)
	end()
	if err != nil {
		return "", fmt.Errorf("restore vm %q: %w", name, err)
	}
	if in != nil {
		// No session is admitted from here; open ones block the restore
		// unless forced.
		end := phase.Begin(ctx, "close the sessions")
		n, ok := in.closeWithin(opts.Force, sessionGrace)
		end()
		if !ok {
			return "", fmt.Errorf("restore vm %q: %d session(s) open (exec, ssh): retry when they end, or use --force to end them: %w", name, n, ErrConflict)
		}
		o.undo.push("admit sessions again", func() error {
			if m.procs.instance(name) == in {
				in.reopen()
			}
			return nil
		})
	}
	// The state the restore replaces is saved first: a running VM's
	// memory and disk, a sleeping one's suspend slot and disk, a stopped
	// one's disk (no memory is left: its VMM died or was stopped). A VM
	// whose restore is still to be finished has no state of its own: its
	// head is that restore's checkpoint, and its disk half-way to it.
	if !opts.NoSave && o.spec.Restoring == "" {
		save := CheckpointOptions{Comment: "auto: before restore to " + id}
		if vm.State == registry.StateStopped {
			save.DiskOnly = true
			progress("saving the current disk first: the vm is stopped, no memory is left (--no-save skips this)")
		} else {
			progress("saving the current state first (--no-save skips this)")
		}
		end := phase.Begin(ctx, "save the current state")
		row, err := o.checkpoint(ctx, save, func(string) {})
		end()
		if err != nil {
			return "", fmt.Errorf("restore vm %q: save current state: %w", name, err)
		}
		saved = row.ID
	}
	if in != nil {
		// Killed, not quit: its memory and its disk's writes since the
		// checkpoint are what the restore throws away.
		progress("stopping the vm")
		end := phase.Begin(ctx, "stop vmm")
		m.procs.stopInstance(ctx, in, stopDiscard)
		end()
	}
	// From here the VM is stopped with the restore recorded: a crash
	// anywhere after leaves it to be finished when the VM is next reached.
	end = phase.Begin(ctx, "registry: restoring")
	err = o.update(ctx, func(v *registry.VM, sp *spec) error {
		sp.Head, sp.Restoring = id, id
		v.State, v.Reason = registry.StateStopped, "restoring "+id
		return nil
	})
	end()
	if err != nil {
		return saved, err
	}
	crashpoint("restore-after-stop")
	return saved, o.finishRestore(ctx, cp, staged, ram, progress)
}

// stagedDisk is a checkpoint's disk being cloned beside a VM's, for a
// restore to rename over the VM's disk once its VMM has stopped.
type stagedDisk struct {
	m      *Manager
	vm, id string
	spare  storage.Path // the checkpoint's spare (checkpointSpare)
	path   storage.Path
	wait   func() error
	used   bool
}

// restoreStage is where a restore clones its checkpoint's disk; one left
// by a crash is removed at the next start (sweepSuspend), by the next
// restore, or with its VM.
func restoreStage(vm string) storage.Path { return storage.VMDir(vm).Join("disk-restoring") }

// stageDisk starts putting checkpoint cp's disk at restoreStage(cp.VM):
// its spare, or a clone.
func (ss *snapshots) stageDisk(ctx context.Context, cp registry.Checkpoint) *stagedDisk {
	vm, id := cp.VM, cp.ID
	st := &stagedDisk{m: ss.m, vm: vm, id: id, spare: checkpointSpare(cp), path: restoreStage(vm)}
	st.wait = ss.m.meanwhile(ctx, "", "", func() error {
		if err := ss.m.vol.Remove(ctx, st.path); err != nil {
			return err
		}
		if ss.m.spares.take(ctx, st.spare, st.path) {
			return nil
		}
		defer phase.Begin(ctx, "clone disk beside the vm's")()
		return ss.m.vol.Clone(ctx, checkpoint.Dir(vm, id).Join(checkpoint.DiskFile), st.path)
	})
	return st
}

// putInPlace renames the staged disk over the VM's, once it is made; the
// error says it could not be (the caller clones another way).
func (st *stagedDisk) putInPlace(ctx context.Context, vm string) error {
	if st == nil {
		return errors.New("no staged disk")
	}
	if err := st.wait(); err != nil {
		return err
	}
	defer phase.Begin(ctx, "volume: staged disk in place")()
	if err := st.m.vol.Rename(ctx, st.path, storage.VMDisk(vm)); err != nil {
		return err
	}
	st.used = true
	return nil
}

// drop keeps the staged disk as its checkpoint's spare unless it was put
// in place (a restore that failed or was refused before): the VM never
// ran on it, so it is still a clone of the checkpoint's disk. With a
// spare there or being made, it is removed.
func (st *stagedDisk) drop() {
	if st == nil || st.used || st.wait() != nil {
		return
	}
	ctx := context.Background()
	if !st.m.spares.put(ctx, st.path, st.spare) {
		_ = st.m.vol.Remove(ctx, st.path)
	}
}

// finishRestore puts a checkpoint's disk in place of the VM's and brings
// the VM up from it: its memory, or a boot for a disk-only checkpoint. It
// is idempotent, so a restore a crash interrupted is finished by running
// it again.
func (o *op) finishRestore(ctx context.Context, cp registry.Checkpoint, staged *stagedDisk, ram *stagedRAM, progress Progress) error {
	m, name, id, vm := o.m, o.name(), cp.ID, o.vm
	defer m.snaps.removeRetired(name) // the old suspend slot, once the VM is up
	progress("cloning the checkpoint's disk over the vm's disk")
	// The disk staged beside the VM's (stageDisk), else the checkpoint's
	// spare disk (spares.go) or a clone of its disk, goes over the VM's
	// while the memory is read in; it is in place before this returns,
	// whatever happens.
	cloned := m.meanwhile(ctx, "", "restore-after-disk", func() error {
		ram.prelaunched().waitHeld() // a VMM prelaunched on the staged disk opens it first
		if err := staged.putInPlace(ctx, name); err == nil {
			return nil
		} else if staged != nil {
			m.log.Debug("den: staged disk for a restore", "vm", name, "err", err)
		}
		if m.spares.take(ctx, checkpointSpare(cp), storage.VMDisk(name)) {
			return nil
		}
		defer phase.Begin(ctx, "clone disk over the vm's")()
		return m.vol.CloneOver(ctx, checkpoint.Dir(name, id).Join(checkpoint.DiskFile), storage.VMDisk(name))
	})
	// Never returns before the disk is in place; its error comes from
	// the wait in the restore or the boot. Then the checkpoint gets a new
	// spare, for the next restore to it.
	defer m.spares.refillCheckpoint(cp)
	defer cloned()
	// A sleeping VM's old memory is obsolete: moved out of the way while
	// the VM comes up, before the record says running, and removed once
	// the restore is over (a crash before leaves it to the next try; no
	// wake uses it, the VM being recorded as restoring).
	m.memc.drop(name, "suspend-")
	retired := m.meanwhile(ctx, "volume: retire the suspend slot", "", func() error {
		return m.snaps.retireSuspend(ctx, name)
	})
	defer retired()
	if cp.Kind == checkpoint.KindMemoryDisk {
		progress("restoring memory")
		local := m.memc.local(name, checkpointKey(id, cp.Seal))
		in, err := o.restoreInto(ctx, restoreSource{snapDir: checkpoint.Dir(name, id).Join(checkpoint.VMMDir), local: local, ram: ram, disks: cloned})
		if err != nil {
			return fmt.Errorf("restore vm %q to %s: %w", name, id, err)
		}
		m.integrity.verifyRunning(in, checkpointRef(cp), vm.VMM)
	} else {
		if err := cloned(); err != nil {
			return fmt.Errorf("restore vm %q to %s: %w", name, id, err)
		}
		progress("booting from the checkpoint's disk")
		if err := m.launch.boot(ctx, vm, o.spec); err != nil {
			return fmt.Errorf("restore vm %q to %s: %w", name, id, err)
		}
	}
	// Not committed, the restore is still recorded, and finished when
	// the VM is next reached.
	err := retired()
	if err == nil {
		err = o.commitRunning(ctx, func(_ *registry.VM, sp *spec) error {
			sp.Restoring = ""
			return nil
		})
	} else if in := o.instance(); in != nil {
		m.procs.stopInstance(ctx, in, stopQuit) // running, but not committed
	}
	if err != nil {
		return fmt.Errorf("restore vm %q to %s: %w", name, id, err)
	}
	return nil
}
