package machine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/registry"
)

// Fork makes a new VM from a checkpoint of another (from its current
// state when id is empty: a checkpoint is taken first). The new VM gets a
// new identity whatever the checkpoint's kind: hostname, machine-id, host
// keys and a reseeded RNG, so that two forks never share random state.
// The new name is checked and taken before anything else happens: a fork
// onto an existing name changes nothing (not that VM's network either),
// and a failed fork (or one a crash cut short) removes the checkpoint it
// took and puts the source's head back.
func (m *Manager) Fork(ctx context.Context, src, id, name string, progress Progress) (registry.VM, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := ValidateName(name); err != nil {
		return registry.VM{}, err
	}
	if id != "" {
		if err := checkpoint.ValidateID(id); err != nil {
			return registry.VM{}, err
		}
	}
	srcVM, err := m.get(ctx, src)
	if err != nil {
		return registry.VM{}, err
	}
	if id != "" { // looked up early, so that an unknown one costs nothing (forkFrom reads it again under the lock)
		if _, err := m.getCheckpoint(ctx, src, id); err != nil {
			return registry.VM{}, err
		}
	}
	if err := m.needSpace(spaceMargin, "fork "+src+" to "+name); err != nil {
		return registry.VM{}, err
	}
	unlock, err := m.lockName(ctx, name, "fork")
	if err != nil {
		return registry.VM{}, err
	}
	defer unlock()
	// A name a VM has is refused before anything is taken for it.
	if err := m.nameFree(ctx, name); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	// The name is taken first, with the source's record as it is now;
	// the sizes are read again under the source's lock.
	now := time.Now().UTC()
	vm := srcVM
	vm.Name, vm.State, vm.Reason, vm.CreatedAt, vm.LastActive = name, registry.StateCreating, "", now, now
	undo := cleanups{log: m.log}
	defer undo.run()
	var own spec
	if err := m.net.takeLease(name, &own, &undo); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	vm.SpecJSON = mustJSON(own)
	if vm, err = m.reserve(ctx, vm, &undo); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	if vm, err = m.forkFrom(ctx, vm, src, id, progress); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	undo.release()
	return vm, nil
}

// forkFrom brings a reserved fork up from src@id (from a checkpoint it
// takes when id is empty). It holds the source's lock throughout, so that
// the checkpoint is not deleted under it (den rm of the source, den
// checkpoint rm) and so that removing the checkpoint it took, when the
// fork fails, needs no second wait for that lock.
func (m *Manager) forkFrom(ctx context.Context, vm registry.VM, src, id string, progress Progress) (_ registry.VM, err error) {
	unlock, err := m.lockVM(ctx, src, "fork to "+vm.Name)
	if err != nil {
		return vm, err
	}
	defer unlock()
	srcVM, err := m.reconcileLocked(ctx, src)
	if err != nil {
		return vm, err
	}
	srcSpec, err := decodeSpec(srcVM)
	if err != nil {
		return vm, err
	}
	own, err := decodeSpec(vm)
	if err != nil {
		return vm, err
	}
	sp := srcSpec
	sp.Head, sp.Restoring, sp.Identity, sp.MAC, sp.Net = "", "", newToken(), newMAC(), own.Net
	sp.URLToken = "" // its own, when first asked for
	sp.Cmdline = m.cmdline(vm.Name, sp.Identity)
	if id == "" {
		progress("checkpointing " + src)
		var auto registry.Checkpoint
		auto, err = m.checkpointLocked(ctx, srcVM, CheckpointOptions{Comment: "auto: fork to " + vm.Name}, func(string) {})
		if err != nil {
			return vm, err
		}
		id = auto.ID
		sp.AutoCheckpoint = src + "@" + id
		defer func() {
			if err != nil {
				if derr := m.dropCheckpoint(context.WithoutCancel(ctx), src, auto); derr != nil {
					m.log.Warn("den: rollback: remove the checkpoint taken for the fork", "vm", src, "checkpoint", id, "err", derr)
				}
			}
		}()
	}
	cp, err := m.getCheckpoint(ctx, src, id)
	if err != nil {
		return vm, err
	}
	if sp.AutoCheckpoint == "" { // one just taken needs no check
		progress("verifying " + src + "@" + id)
		if err := m.verify(ctx, checkpointRef(cp), srcVM.VMM); err != nil {
			return vm, err
		}
	}
	if srcSpec.Net == nil && own.Net != nil && cp.Kind == checkpoint.KindMemoryDisk {
		// The source's memory holds the VMM's user-mode network (a VM
		// made before TAP networking): the fork restores into the same.
		m.net.dropLease(ctx, vm.Name, own.Net)
		sp.Net = nil
	}
	sp.ForkedFrom = src + "@" + id
	vm, err = m.db.UpdateVMIf(ctx, vm.Name, vm.Generation, func(v *registry.VM) error {
		v.Image, v.CPUs, v.MemoryBytes, v.DiskBytes, v.VMM, v.Accel = srcVM.Image, srcVM.CPUs, srcVM.MemoryBytes, srcVM.DiskBytes, srcVM.VMM, srcVM.Accel
		v.SpecJSON = mustJSON(sp)
		return nil
	})
	if err != nil {
		return vm, err
	}
	from := bringUpFrom{disk: checkpoint.Dir(src, id).Join(checkpoint.DiskFile), what: src + "@" + id, ref: checkpointRef(cp)}
	if cp.Kind == checkpoint.KindMemoryDisk {
		from.memory = checkpoint.Dir(src, id).Join(checkpoint.VMMDir)
	}
	return m.bringUp(ctx, vm, sp, from, progress) // the caller's stack removes the VM on failure
}

// dropCheckpoint removes a checkpoint (one a failed fork took, or one
// whose deletion a crash cut short), and moves the VM's head back to the
// checkpoint's parent if it is the head; the caller owns the VM (holds
// its lock, or is the start-up reconcile).
func (m *Manager) dropCheckpoint(ctx context.Context, name string, cp registry.Checkpoint) error {
	vm, err := m.get(ctx, name)
	if err != nil {
		return err
	}
	if sp, err := decodeSpec(vm); err == nil && sp.Head == cp.ID {
		if err := m.setHead(ctx, name, cp.Parent); err != nil {
			return err
		}
	}
	return m.deleteCheckpoint(ctx, name, cp.ID)
}

// rollBackAutoCheckpoint drops the checkpoint a fork took, when a crash
// left the fork half-made (start-up reconcile).
func (m *Manager) rollBackAutoCheckpoint(ctx context.Context, fork registry.VM) {
	sp, err := decodeSpec(fork)
	if err != nil || sp.AutoCheckpoint == "" {
		return
	}
	src, id, _ := strings.Cut(sp.AutoCheckpoint, "@")
	cp, err := m.db.GetCheckpoint(ctx, src, id)
	if errors.Is(err, registry.ErrNotFound) {
		return
	}
	if err == nil {
		err = m.dropCheckpoint(ctx, src, cp)
	}
	if err != nil {
		m.log.Warn("den: rollback: remove the checkpoint taken for an interrupted fork", "vm", src, "checkpoint", id, "err", err)
	}
}
