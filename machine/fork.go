package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/registry"
)

// Fork makes a new VM from a checkpoint of another (from its current
// state when id is empty: a checkpoint is taken first). The new VM gets a
// new identity whatever the checkpoint's kind: hostname, machine-id, host
// keys and a reseeded RNG, so that two forks never share random state.
// The new name is taken before anything else happens: a fork onto an
// existing name changes nothing, and a failed fork removes the
// checkpoint it took and puts the source's head back.
func (m *Manager) Fork(ctx context.Context, src, id, name string, progress Progress) (registry.VM, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := ValidateName(name); err != nil {
		return registry.VM{}, err
	}
	if id != "" {
		if err := checkpoint.ValidateID(id); err != nil {
			return registry.VM{}, fmt.Errorf("%w: %w", err, ErrInvalid)
		}
	}
	srcVM, err := m.get(ctx, src)
	if err != nil {
		return registry.VM{}, err
	}
	if err := m.needSpace(spaceMargin, "fork "+src+" to "+name); err != nil {
		return registry.VM{}, err
	}
	unlock, err := m.lockVM(ctx, name, "fork")
	if err != nil {
		return registry.VM{}, err
	}
	defer unlock()

	srcSpec, err := decodeSpec(srcVM)
	if err != nil {
		return registry.VM{}, err
	}
	sp := srcSpec
	sp.Head, sp.Restoring, sp.Identity = "", "", newToken()
	sp.Cmdline = m.cmdline(name, sp.Identity)
	now := time.Now().UTC()
	vm := srcVM
	vm.Name, vm.State, vm.Reason, vm.CreatedAt, vm.LastActive = name, registry.StateCreating, "", now, now
	vm.SpecJSON = mustJSON(sp)
	undo := cleanups{log: m.log}
	defer undo.run()
	if vm, err = m.reserve(ctx, vm, &undo); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	if id == "" {
		progress("checkpointing " + src)
		cp, err := m.Checkpoint(ctx, src, CheckpointOptions{Comment: "auto: fork to " + name}, nil)
		if err != nil {
			return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
		}
		id = cp.ID
		undo.push("remove the checkpoint "+id+" taken for the fork", func() error {
			return m.dropAutoCheckpoint(context.WithoutCancel(ctx), src, cp)
		})
	}
	if vm, err = m.forkFrom(ctx, vm, sp, src, id, &undo, progress); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	undo.release()
	return vm, nil
}

// forkFrom brings a reserved fork up from src@id, holding the source's
// lock meanwhile so that the checkpoint is not deleted under it (den rm
// of the source, den checkpoint rm).
func (m *Manager) forkFrom(ctx context.Context, vm registry.VM, sp spec, src, id string, undo *cleanups, progress Progress) (registry.VM, error) {
	unlock, err := m.lockVM(ctx, src, "fork to "+vm.Name)
	if err != nil {
		return vm, err
	}
	defer unlock()
	cp, err := m.getCheckpoint(ctx, src, id)
	if err != nil {
		return vm, err
	}
	sp.ForkedFrom = src + "@" + id
	vm, err = m.db.UpdateVMIf(ctx, vm.Name, vm.Generation, func(v *registry.VM) error {
		v.SpecJSON = mustJSON(sp)
		return nil
	})
	if err != nil {
		return vm, err
	}
	from := bringUpFrom{disk: checkpoint.Dir(src, id).Join(checkpoint.DiskFile), what: src + "@" + id}
	if cp.Kind == checkpoint.KindMemoryDisk {
		from.memory = checkpoint.Dir(src, id).Join(checkpoint.VMMDir)
	}
	return m.bringUp(ctx, vm, sp, from, undo, progress)
}

// dropAutoCheckpoint removes a checkpoint a failed operation took, and
// moves the VM's head back to the checkpoint's parent if it is still
// the head.
func (m *Manager) dropAutoCheckpoint(ctx context.Context, name string, cp registry.Checkpoint) error {
	unlock, err := m.lockVM(ctx, name, "roll back checkpoint "+cp.ID)
	if err != nil {
		return err
	}
	defer unlock()
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
