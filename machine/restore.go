package machine

import (
	"context"
	"errors"
	"fmt"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

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
	if cp.Kind == checkpoint.KindMemoryDisk {
		// Refused before anything changes, where restoreInto would
		// refuse it only once the VM's own state is gone.
		if _, err := m.compat.check(ctx, checkpoint.Dir(name, id).Join(checkpoint.VMMDir), vm.VMM); err != nil {
			return "", fmt.Errorf("restore vm %q to %s: %w", name, id, err)
		}
	}
	// The checkpoint's memory is copied into a RAM file of its own, its
	// disk cloned beside the VM's and, with both, the new VMM started
	// beside the old while the checkpoint is verified, the current state
	// saved and the old VMM stopped: what is left for after is a rename
	// and the incoming migration.
	ram := m.snaps.stageRAM(ctx, vm, cp)
	o.undo.always("drop the staged memory", ram.drop)
	staged := m.snaps.stageDisk(ctx, cp)
	o.undo.always("give back the staged disk", staged.drop)
	in := o.instance()
	if ram != nil {
		ram.pre = m.launch.prelaunch(ctx, vm, o.spec, in, ram, staged)
		o.undo.always("stop the prelaunched vmm", ram.pre.drop) // before the staged disk's drop
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
		if vm.State == registry.StateStopped || vm.State == registry.StateLost {
			save.DiskOnly = true
			progress(fmt.Sprintf("saving the current disk first: the vm is %s, no memory is left (--no-save skips this)", vm.State))
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
	if in != nil && saved == "" {
		m.records.pullBefore(ctx, name, in) // what ran until the restore
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
	st.wait = meanwhile(ctx, "", "", func() error {
		if err := ss.m.vol.Remove(ctx, st.path); err != nil {
			return err
		}
		if ss.spares.take(ctx, st.spare, st.path) {
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
	if !st.m.snaps.spares.put(ctx, st.path, st.spare) {
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
	cloned := meanwhile(ctx, "", "restore-after-disk", func() error {
		ram.prelaunched().waitHeld() // a VMM prelaunched on the staged disk opens it first
		if err := staged.putInPlace(ctx, name); err == nil {
			return nil
		} else if staged != nil {
			m.log.Debug("den: staged disk for a restore", "vm", name, "err", err)
		}
		if m.snaps.spares.take(ctx, checkpointSpare(cp), storage.VMDisk(name)) {
			return nil
		}
		defer phase.Begin(ctx, "clone disk over the vm's")()
		return m.vol.CloneOver(ctx, checkpoint.Dir(name, id).Join(checkpoint.DiskFile), storage.VMDisk(name))
	})
	// Never returns before the disk is in place; its error comes from
	// the wait in the restore or the boot. Then the checkpoint gets a new
	// spare, for the next restore to it.
	defer m.snaps.spares.refillCheckpoint(cp)
	defer cloned()
	// A sleeping VM's old memory is obsolete: moved out of the way while
	// the VM comes up, before the record says running, and removed once
	// the restore is over (a crash before leaves it to the next try; no
	// wake uses it, the VM being recorded as restoring).
	m.snaps.memc.drop(name, "suspend-")
	retired := meanwhile(ctx, "volume: retire the suspend slot", "", func() error {
		return m.snaps.retireSuspend(ctx, name)
	})
	defer retired()
	if cp.Kind == checkpoint.KindMemoryDisk {
		progress("restoring memory")
		local := m.snaps.memc.local(name, checkpointKey(id, cp.Seal))
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
	// The guest's record goes on from where it was at the checkpoint.
	mark := vmEvent(activity.EventRestore, id, "")
	mark.Cursor = unknownCursor
	if cp.Kind == checkpoint.KindMemoryDisk {
		mark.Cursor = m.records.cursorAt(name, id)
	} else {
		mark.Detail = "booted from the checkpoint's disk"
	}
	m.records.mark(name, mark)
	return nil
}
