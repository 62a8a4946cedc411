package machine

import (
	"context"
	"errors"
	"fmt"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// reserve records the new VM as creating (its name is then taken), with
// the undo of everything a rollback must remove for it.
func (o *op) reserve(ctx context.Context, vm registry.VM) error {
	m := o.m
	if err := m.db.CreateVM(ctx, vm); err != nil {
		if errors.Is(err, registry.ErrExists) {
			return errNameTaken
		}
		return err
	}
	o.undo.push("delete the record of vm "+vm.Name, func() error {
		return m.db.DeleteVM(context.WithoutCancel(ctx), vm.Name)
	})
	o.undo.push("remove the files of vm "+vm.Name, func() error {
		m.procs.destroy(context.WithoutCancel(ctx), vm.Name)
		return nil
	})
	rec, err := m.get(ctx, vm.Name)
	if err != nil {
		return err
	}
	if err := o.read(rec); err != nil {
		return err
	}
	return o.ownSubnet(ctx)
}

// ownSubnet gives the new VM another subnet while the record gives its
// own to another VM too: in a cluster, hosts that create VMs at once may
// pick the same one (each passes by the subnets recorded before it
// chose). The VM that finds the other recorded moves; should both, each
// tries again, a few times.
func (o *op) ownSubnet(ctx context.Context) error {
	n := &o.m.net
	for try := 0; o.spec.Net != nil; try++ {
		other, err := n.sharer(ctx, o.name(), *o.spec.Net)
		if err != nil || other == "" {
			return err
		}
		if try == 4 {
			return fmt.Errorf("network: its subnet %s is vm %q's too, and so was every other it took: %w", o.spec.Net.Subnet, other, ErrBusy)
		}
		old := *o.spec.Net
		var sp spec
		if err := n.takeLease(ctx, o.name(), &sp, true, &o.undo); err != nil {
			return err
		}
		if err := o.update(ctx, func(_ *registry.VM, s *spec) error { s.Net = sp.Net; return nil }); err != nil {
			return err
		}
		n.dropLease(ctx, o.name(), &old)
		o.m.log.Info("den: a new vm's subnet was another's too: it takes another", "vm", o.name(), "other", other, "from", old.Subnet, "to", sp.Net.Subnet)
	}
	return nil
}

// nameFree refuses a name a VM has in db. Create and fork check it
// under the name's lock before they take anything for the new VM (a
// lease, a checkpoint of the source), so that a refusal has nothing to
// undo.
func nameFree(ctx context.Context, db registry.Store, name string) error {
	_, err := db.GetVM(ctx, name)
	switch {
	case err == nil:
		return errNameTaken
	case errors.Is(err, registry.ErrNotFound):
		return nil
	}
	return err
}

// errNameTaken says a name is a VM's; the caller says which name.
var errNameTaken = fmt.Errorf("the name is taken (vm names are one namespace per host; whose is not said): %w", ErrExists)

// bringUpFrom is where a new VM's disk and (unless it boots) memory come
// from: an image, a warm base or a checkpoint.
type bringUpFrom struct {
	disk   storage.Path // cloned as the VM's disk
	memory storage.Path // VMM snapshot to restore; "" boots instead
	what   string       // for progress lines
	ref    snapshotRef  // the sealed directory memory is in
	// spare: disk is a base's, which never changes: a spare clone of
	// it is taken when there is one, and made for the next (spares.go).
	spare bool
}

// bringUp is the one bring-up of a new VM, for create and fork: clone
// the disk, restore the memory with a new identity (or cold-boot, where
// the guest's initramfs applies the identity on the command line before
// anything reads it), grow the disk and the guest's filesystem to the
// VM's size, and record the VM running.
func (o *op) bringUp(ctx context.Context, from bringUpFrom, progress Progress) error {
	m, vm, sp := o.m, o.vm, o.spec
	accel := m.vmms.caps(m.vmmName).Accelerator
	srcSize, err := m.disks.fileSize(from.disk)
	if err != nil {
		return err
	}
	grow := vm.DiskBytes > srcSize
	progress("cloning the disk of " + from.what)
	// The clone runs while the memory is read in; it is over before this
	// returns (and a rollback removes the VM's files), whatever happens.
	cloned := meanwhile(ctx, "", "bringup-after-clone", func() error {
		if from.spare && m.snaps.spares.take(ctx, spareFor(from.disk), storage.VMDisk(vm.Name)) {
			return nil
		}
		defer phase.Begin(ctx, "clone disk")()
		if err := m.vol.Clone(ctx, from.disk, storage.VMDisk(vm.Name)); err != nil {
			return fmt.Errorf("clone disk: %w", err)
		}
		return nil
	})
	if from.spare {
		defer m.snaps.spares.refill(from.disk, spareFor(from.disk)) // once this create is over
	}
	defer cloned() // never returns before the clone is over; its error comes from the wait in the restore or the boot
	if from.memory != "" {
		progress("restoring the memory of " + from.what + " (" + vm.VMM + ", " + accel + ")")
		id := m.agents.identityRequest(vm, sp)
		in, err := o.restoreInto(ctx, restoreSource{snapDir: from.memory, local: from.ref.local, disks: cloned, identity: &id})
		if err != nil {
			return err
		}
		m.integrity.verifyRunning(in, from.ref, vm.VMM)
		if grow {
			progress("growing the disk to " + FormatSize(vm.DiskBytes))
			end := phase.Begin(ctx, "grow disk")
			err := m.disks.growDisk(ctx, vm, in)
			end()
			if err != nil {
				return err
			}
		}
	} else {
		if err := cloned(); err != nil {
			return err
		}
		if err := m.disks.growDiskFile(vm.Name, vm.DiskBytes); err != nil {
			return err
		}
		progress("booting (" + vm.VMM + ", " + accel + ")")
		if err := m.launch.boot(ctx, vm, sp); err != nil {
			return err
		}
		if grow {
			progress("growing the root filesystem to " + FormatSize(vm.DiskBytes))
			if err := m.disks.growDisk(ctx, vm, m.procs.instance(vm.Name)); err != nil {
				return err
			}
		}
	}
	crashpoint("bringup-before-commit")
	return o.commitRunning(ctx, nil)
}
