package machine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/denhq/den/activity"
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
func (m *Manager) Fork(ctx context.Context, src, id, name string, progress Progress) (_ registry.VM, err error) {
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
	if err := m.guard.needSpace(spaceMargin, "fork "+src+" to "+name); err != nil {
		return registry.VM{}, err
	}
	fo, err := m.beginNew(ctx, name, "fork")
	if err != nil {
		return registry.VM{}, err
	}
	defer func() { fo.end(err) }()
	// A name a VM has is refused before anything is taken for it.
	if err := nameFree(ctx, m.db, name); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	// The name is taken first, with the source's record as it is now;
	// the sizes are read again under the source's lock.
	now := time.Now().UTC()
	vm := srcVM
	vm.Name, vm.State, vm.Reason, vm.CreatedAt, vm.LastActive = name, registry.StateCreating, "", now, now
	var own spec
	if err := m.net.takeLease(ctx, name, &own, false, &fo.undo); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	vm.SpecJSON = mustJSON(own)
	if err := fo.reserve(ctx, vm); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	if err := fo.forkFrom(ctx, src, id, progress); err != nil {
		return registry.VM{}, fmt.Errorf("fork %s to %q: %w", src, name, err)
	}
	return fo.vm, nil
}

// forkFrom brings the reserved fork up from src@id (from a checkpoint it
// takes when id is empty). It holds the source's lock throughout, so that
// the checkpoint is not deleted under it (den rm of the source, den
// checkpoint rm), and the checkpoint it took is the source operation's
// to remove when the fork fails, before that lock goes.
func (o *op) forkFrom(ctx context.Context, src, id string, progress Progress) (err error) {
	m, name, own := o.m, o.name(), o.spec
	so, err := m.begin(ctx, src, "fork to "+name)
	if err != nil {
		return err
	}
	defer func() { so.end(err) }()
	srcVM, srcSpec := so.vm, so.spec
	sp := srcSpec
	sp.Head, sp.Restoring, sp.Identity, sp.MAC, sp.Net = "", "", newToken(), newMAC(), own.Net
	sp.URLToken = "" // its own, when first asked for
	sp.Cmdline = m.launch.cmdline(name, sp.Identity)
	if id == "" {
		progress("checkpointing " + src)
		auto, err := so.checkpoint(ctx, CheckpointOptions{Comment: "auto: fork to " + name}, func(string) {})
		if err != nil {
			return err
		}
		id = auto.ID
		sp.AutoCheckpoint = src + "@" + id
		so.undo.push("remove the checkpoint "+src+"@"+id+" taken for the fork", func() error {
			return so.dropCheckpoint(context.WithoutCancel(ctx), auto)
		})
	}
	cp, err := m.getCheckpoint(ctx, src, id)
	if err != nil {
		return err
	}
	if sp.AutoCheckpoint == "" { // one just taken needs no check
		progress("verifying " + src + "@" + id)
		if err := m.integrity.verify(ctx, checkpointRef(cp), srcVM.VMM); err != nil {
			return err
		}
	}
	if srcSpec.Net == nil && own.Net != nil && cp.Kind == checkpoint.KindMemoryDisk {
		// The source's memory holds the VMM's user-mode network (a VM
		// made before TAP networking): the fork restores into the same.
		m.net.dropLease(ctx, name, own.Net)
		sp.Net = nil
	}
	sp.ForkedFrom = src + "@" + id
	sp.Schedule = nil // the source's checkpoints are the source's to schedule
	if err := o.update(ctx, func(v *registry.VM, fsp *spec) error {
		v.Image, v.CPUs, v.MemoryBytes, v.DiskBytes, v.VMM, v.Accel = srcVM.Image, srcVM.CPUs, srcVM.MemoryBytes, srcVM.DiskBytes, srcVM.VMM, srcVM.Accel
		*fsp = sp
		return nil
	}); err != nil {
		return err
	}
	from := bringUpFrom{disk: checkpoint.Dir(src, id).Join(checkpoint.DiskFile), what: src + "@" + id, ref: checkpointRef(cp)}
	if cp.Kind == checkpoint.KindMemoryDisk {
		from.memory = checkpoint.Dir(src, id).Join(checkpoint.VMMDir)
	}
	if err := o.bringUp(ctx, from, progress); err != nil {
		return err // the fork's stack removes it
	}
	mark := vmEvent(activity.EventFork, "", "")
	mark.From, mark.Cursor = src+"@"+id, unknownCursor
	if from.memory != "" {
		mark.Cursor = m.records.cursorAt(src, id)
	} else {
		mark.Detail = "booted from the checkpoint's disk"
	}
	m.records.mark(name, mark)
	return nil
}

// rollBackAutoCheckpoint drops the checkpoint a fork took, when a crash
// left the fork half-made (start-up reconcile).
func (su *startup) rollBackAutoCheckpoint(ctx context.Context, fork registry.VM) {
	sp, err := decodeSpec(fork)
	if err != nil || sp.AutoCheckpoint == "" {
		return
	}
	src, id, _ := strings.Cut(sp.AutoCheckpoint, "@")
	cp, err := su.m.db.GetCheckpoint(ctx, src, id)
	if errors.Is(err, registry.ErrNotFound) {
		return
	}
	if err == nil {
		var o *op
		if o, err = su.m.owned(ctx, src); err == nil {
			err = o.dropCheckpoint(ctx, cp)
		}
	}
	if err != nil {
		su.m.log.Warn("den: rollback: remove the checkpoint taken for an interrupted fork", "vm", src, "checkpoint", id, "err", err)
	}
}
