package machine

import (
	"context"
	"errors"
	"fmt"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/memstore"
	"github.com/denhq/den/storage"
)

// Wake restores a sleeping VM from its suspend slot, or boots a stopped
// or lost one from its disk, and waits for its agent; a running VM is
// left as it is.
func (m *Manager) Wake(ctx context.Context, name string) error {
	_, err := m.ensureRunning(ctx, name, "", false, true)
	return err
}

// wake restores the sleeping VM. The suspend slot stays until the next
// sleep replaces it (a VMM restoring memory lazily reads it for as long
// as the VM runs).
func (o *op) wake(ctx context.Context) error {
	m, vm, seal := o.m, o.vm, o.spec.SuspendSeal
	// The memory is verified while the VMM starts: the local copy of it
	// when there is one, which is then what the VMM reads.
	// Without one, the memory kept by content is checked as the VMM's
	// RAM is filled with it, before the guest runs (ref.filled): the fill
	// starts now, staged, rather than once the VMM does.
	key := suspendKey(seal, vm.Generation)
	ref := m.snaps.withLocalMemory(suspendRef(vm.Name, seal), key)
	ref.filled = true
	check := func(ctx context.Context) error {
		if err := m.integrity.verify(ctx, ref, vm.VMM); err != nil {
			return verifyFailed{err}
		}
		return nil
	}
	// On a host of a cluster other than the one that put it to sleep,
	// the memory is read from that host's local copy, if it still has
	// one, else from the volume.
	stage := func(ctx context.Context, pc peerCopy) *stagedRAM { return m.snaps.stageFill(ctx, vm, ref, pc) }
	in, err := o.restoreInto(ctx, restoreSource{snapDir: ref.dir, local: ref.local, stage: stage, check: check, peer: peerCopy{vm: vm.Name, key: key}})
	if err != nil {
		var vf verifyFailed
		var d memstore.Damage
		switch {
		case errors.Is(err, errGuestRan):
			m.snaps.dropRunSlot(ctx, vm.Name, err)
		case errors.As(err, &vf):
			err = stillAsleep(err, vm.Name)
		case errors.As(err, &d): // found by the fill
			err = stillAsleep(m.integrity.failed(ref, damaged{d}), vm.Name)
		}
		return fmt.Errorf("wake vm %q: %w", vm.Name, err)
	}
	m.integrity.verifyRunning(in, suspendRef(vm.Name, seal), vm.VMM)
	crashpoint("wake-after-restore")
	if err := o.commitRunning(ctx, nil); err != nil {
		// Its guest ran: its slot goes too.
		err = fmt.Errorf("record it running: %w", err)
		m.snaps.dropRunSlot(ctx, vm.Name, err)
		return fmt.Errorf("wake vm %q: %w", vm.Name, err)
	}
	m.records.mark(vm.Name, vmEvent(activity.EventWake, "", ""))
	return nil
}

// dropRunSlot ends a wake that failed after the guest ran from the
// suspend slot (its VMM stopped): the guest may have written its disk,
// so the slot's memory no longer matches it and must never be restored
// again. The slot goes first, then the record says stopped: the VM boots
// from its disk when next used. A record that cannot be written either
// leaves a sleeping VM without a slot, whose wake is refused, never one
// that a wake restores from stale memory.
func (ss *snapshots) dropRunSlot(ctx context.Context, name string, cause error) {
	ctx = context.WithoutCancel(ctx)
	ss.memc.drop(name, "suspend-")
	if err := ss.m.vol.Remove(ctx, storage.SuspendDir(name)); err != nil {
		ss.m.log.Warn("den: remove the suspend slot of a wake that failed after the guest ran", "vm", name, "err", err)
	}
	ss.m.gc.poke()
	ss.m.procs.recordStopped(ctx, name, "wake failed after the guest ran ("+cause.Error()+"); it boots from its disk when next used")
}

// stillAsleep says that the VM stays asleep after a wake refused its
// memory.
func stillAsleep(err error, vm string) error {
	return fmt.Errorf("%w; it stays asleep: restore a checkpoint (den checkpoints %s)", err, vm)
}

// verifyFailed is a wake's verification that failed: the VM stays asleep.
type verifyFailed struct{ error }

func (v verifyFailed) Unwrap() error { return v.error }
