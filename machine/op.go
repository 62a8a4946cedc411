package machine

import (
	"context"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
)

// op is one operation on one VM, from taking its lock to its end: the
// record as read (and since written) under the lock, its spec decoded
// once, and the undo of everything the operation took, bound to what it
// took (a lease, a staged disk, a paused VMM), never looked up by name
// again. Every write of the record is a compare-and-set on the
// generation the operation last saw, so a record somebody else wrote
// meanwhile fails the operation instead of being overwritten.
type op struct {
	m    *Manager
	kind string
	// vm is the record as the operation last read or wrote it; spec is
	// its spec, decoded. A VM being created has none until reserve.
	vm   registry.VM
	spec spec
	// undo is the operation's cleanup stack: steps are pushed as things
	// are taken, and run newest first by end (or finish) when it failed,
	// with its error in err; the always steps (what it only borrowed)
	// run either way.
	undo   cleanups
	err    error
	unlock func()
	// anySpec: the operation works on a VM whose spec does not decode
	// (rm); then badSpec is set, and its writes leave the spec as it is.
	anySpec, badSpec bool
	// bootLost: a person asked for the VM to run (den wake, a restart
	// policy), so run boots a lost one from its disk.
	bootLost bool
}

// begin takes an existing VM's lock for an operation (kind names it in
// busy lines), refusing a VM that is not the owner's AsOwner named, then
// reads its record, checked against its VMM (reconcileLocked), and
// decodes its spec.
func (m *Manager) begin(ctx context.Context, name, kind string) (*op, error) {
	return m.beginOn(ctx, &op{m: m, kind: kind, undo: cleanups{log: m.log}}, name)
}

// beginAnySpec is begin for an operation that must also work on a VM
// whose recorded spec does not decode (rm).
func (m *Manager) beginAnySpec(ctx context.Context, name, kind string) (*op, error) {
	return m.beginOn(ctx, &op{m: m, kind: kind, undo: cleanups{log: m.log}, anySpec: true}, name)
}

func (m *Manager) beginOn(ctx context.Context, o *op, name string) (*op, error) {
	if _, err := m.get(ctx, name); err != nil {
		return nil, err // an unknown name gets no lock file
	}
	unlock, err := m.locks.lockVM(ctx, name, o.kind)
	if err != nil {
		return nil, err
	}
	o.unlock = unlock
	return o.hold(ctx, name)
}

// holding begins an operation on a VM whose lock the caller took
// (unlock lets it go, also when this fails).
func (m *Manager) holding(ctx context.Context, name, kind string, unlock func()) (*op, error) {
	o := &op{m: m, kind: kind, undo: cleanups{log: m.log}, unlock: unlock}
	return o.hold(ctx, name)
}

// hold reads the record of the VM whose lock the operation holds.
func (o *op) hold(ctx context.Context, name string) (*op, error) {
	unlock := o.unlock
	vm, err := o.m.locks.reconcileLocked(ctx, name)
	if err == nil {
		err = o.read(vm)
	}
	if err != nil {
		unlock()
		return nil, err
	}
	return o, nil
}

// beginNew takes a new name's lock, for create and fork, which then
// check that no VM has it (nameFree) before they take anything for it.
// The record comes with reserve.
func (m *Manager) beginNew(ctx context.Context, name, kind string) (*op, error) {
	unlock, err := m.locks.lockName(ctx, name, kind)
	if err != nil {
		return nil, err
	}
	return &op{m: m, kind: kind, vm: registry.VM{Name: name}, undo: cleanups{log: m.log}, unlock: unlock}, nil
}

// owned is an operation on a VM the caller owns without its lock: the
// start-up reconcile, before any other operation runs. It works on a
// spec that does not decode, as rm does.
func (m *Manager) owned(ctx context.Context, name string) (*op, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	o := &op{m: m, kind: "start-up", undo: cleanups{log: m.log}, unlock: func() {}, anySpec: true}
	return o, o.read(vm)
}

// read makes vm the operation's record, with its spec decoded.
func (o *op) read(vm registry.VM) error {
	sp, err := decodeSpec(vm)
	if err != nil && !o.anySpec {
		return err
	}
	o.vm, o.spec, o.badSpec = vm, sp, err != nil
	return nil
}

// name is the VM's name.
func (o *op) name() string { return o.vm.Name }

// instance is the VM's running instance, if any.
func (o *op) instance() *instance { return o.m.procs.instance(o.vm.Name) }

// finish ends the operation's work without letting the VM go: with err,
// what it took is undone (newest first), else kept.
func (o *op) finish(err error) {
	if err != nil {
		o.err = err
		o.undo.run()
		return
	}
	o.undo.release()
}

// end finishes the operation and lets the VM go. A VM the operation
// left sleeping, stopped or lost has its disk measured in the background
// (usage.go): nothing changes it until its record does.
func (o *op) end(err error) {
	o.finish(err)
	o.unlock()
	if err == nil && o.vm.Name != "" {
		switch o.vm.State {
		case registry.StateSleeping, registry.StateStopped, registry.StateLost:
			o.m.usage.soon(o.vm)
		}
	}
}

// update writes the record: change edits it and its spec (a copy of the
// operation's). It is a compare-and-set on the generation the operation
// last saw; the operation then has the record as written.
func (o *op) update(ctx context.Context, change func(*registry.VM, *spec) error) error {
	sp := o.spec
	rec, err := o.m.db.UpdateVMIf(ctx, o.vm.Name, o.vm.Generation, func(v *registry.VM) error {
		if change != nil {
			if err := change(v, &sp); err != nil {
				return err
			}
		}
		if !o.badSpec {
			v.SpecJSON = mustJSON(sp)
		}
		return nil
	})
	if err != nil {
		return err
	}
	o.vm, o.spec = rec, sp
	return nil
}

// commitRunning records the VM running, once its VMM runs: the one
// commit of create, fork, start, wake and restore, with change (if any)
// made to the record and spec too. A VMM whose record does not say
// running must not run on: when the record cannot be written, the VM's
// instance is stopped. Committed, the instance admits sessions.
func (o *op) commitRunning(ctx context.Context, change func(*registry.VM, *spec) error) error {
	end := phase.Begin(ctx, "registry")
	err := o.update(ctx, func(v *registry.VM, sp *spec) error {
		if change != nil {
			if err := change(v, sp); err != nil {
				return err
			}
		}
		v.State, v.Reason, v.LastActive = registry.StateRunning, "", time.Now().UTC()
		return nil
	})
	end()
	in := o.instance()
	if err != nil {
		if in != nil {
			o.m.procs.stopInstance(ctx, in, stopQuit)
		}
		return err
	}
	if in != nil {
		in.reopen()
	}
	return nil
}
