package machine

import (
	"context"
	"fmt"
	"strings"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// Sleep saves a running VM's memory into its suspend slot and stops its
// VMM: no process, no guest RAM held. Anything that reaches the VM later
// wakes it. Open sessions make it refuse unless force.
func (m *Manager) Sleep(ctx context.Context, name string, force bool) (err error) {
	o, err := m.begin(ctx, name, "sleep")
	if err != nil {
		return err
	}
	defer func() { o.end(err) }()
	return o.sleep(ctx, force)
}

// sleep puts the running VM to sleep: a new snapshot in suspend-new, which
// replaces the suspend slot once whole, then the record, then the VMM
// stops. A failure before the record runs the paused VM again.
func (o *op) sleep(ctx context.Context, force bool) error {
	m, name, vm := o.m, o.name(), o.vm
	if vm.State == registry.StateSleeping {
		return nil
	}
	in := o.instance()
	if vm.State != registry.StateRunning || in == nil || !alive(in) {
		return fmt.Errorf("sleep vm %q: it is %s, not running: %w", name, vm.State, ErrConflict)
	}
	if err := m.guard.needSpace(m.guard.memorySnapshotNeed(vm), "sleep vm "+name); err != nil {
		return err
	}
	// From here no session is admitted: they wait for the lock, then
	// wake the VM.
	if n, ok := in.closeWithin(force, sessionGrace); !ok {
		return fmt.Errorf("sleep vm %q: %d session(s) open (exec, ssh): %w", name, n, ErrConflict)
	}
	o.undo.push("admit sessions again", func() error {
		if m.procs.instance(name) == in {
			in.reopen()
		}
		return nil
	})
	end := phase.Begin(ctx, "activity record")
	m.records.pullBefore(ctx, name, in)
	end()
	tmp := suspendNew(name)
	end = phase.Begin(ctx, "volume: make the slot")
	err := m.vol.Remove(ctx, tmp)
	if err == nil {
		err = m.vol.MkdirAll(ctx, tmp)
	}
	end()
	if err != nil {
		return err
	}
	end = phase.Begin(ctx, "pause")
	err = in.hv.Pause(ctx)
	end()
	if err != nil {
		return fmt.Errorf("sleep vm %q: %w", name, err)
	}
	crashpoint("sleep-after-pause")
	// The RAM file is copied locally while the snapshot is written: a
	// wake reads that copy (memcopy.go). A failure resumes the VM first,
	// then drops the copy (which waits for it).
	memCopy := m.snaps.startMemCopy(name)
	o.undo.push("drop the local memory copy", func() error {
		memCopy.drop()
		return nil
	})
	o.resumeOnFailure(ctx, in)
	seal, err := o.writeSuspend(ctx, in, tmp, memCopy != nil)
	if err != nil {
		_ = m.vol.Remove(ctx, tmp)
		return fmt.Errorf("sleep vm %q: %w", name, err)
	}
	crashpoint("sleep-after-snapshot")
	// The new snapshot is whole: it replaces the old slot, and the record
	// says sleeping, before the VMM stops. A crash in between leaves a
	// whole slot, a sleeping record and a paused VMM, which the next
	// start stops.
	end = phase.Begin(ctx, "volume: swap the slot")
	err = m.snaps.swapSuspend(ctx, name)
	end()
	defer m.snaps.removeRetired(name) // the old slot, once the sleep is over
	if err != nil {
		return fmt.Errorf("sleep vm %q: %w", name, err)
	}
	_, lastAct := in.activity()
	end = phase.Begin(ctx, "registry")
	err = o.update(ctx, func(v *registry.VM, sp *spec) error {
		sp.SuspendSeal = seal // the slot's digests, with the state that uses it
		v.State, v.Reason = registry.StateSleeping, ""
		if lastAct.After(v.LastActive) {
			v.LastActive = lastAct.UTC()
		}
		return nil
	})
	end()
	if err != nil {
		return fmt.Errorf("sleep vm %q: %w", name, err)
	}
	crashpoint("sleep-after-record")
	m.records.mark(name, vmEvent(activity.EventSleep, "", ""))
	key := suspendKey(seal, o.vm.Generation)
	end = phase.Begin(ctx, "wait for the local memory copy")
	memCopy.keep(key) // before the VMM and its RAM file go
	end()
	end = phase.Begin(ctx, "stop vmm")
	m.procs.stopInstance(ctx, in, stopQuit)
	end()
	m.integrity.sealLater(storage.SuspendDir(name), m.snaps.withLocalMemory(suspendRef(name, seal), key))
	return nil
}

// resumeOnFailure makes a failure from here run the paused VM again;
// one that cannot be resumed is stopped and recorded so, never left
// paused as running.
func (o *op) resumeOnFailure(ctx context.Context, in *instance) {
	m := o.m
	o.undo.push("resume the paused vm", func() error {
		// The slot may hold the new snapshot now: the next one is
		// written whole (delta.go).
		in.origin.set(memOrigin{})
		if rerr := checkpoint.Resume(context.WithoutCancel(ctx), guestOf{m: m, in: in}, m.log); rerr != nil {
			m.procs.stopInstance(ctx, in, stopQuit)
			cause := strings.TrimPrefix(o.err.Error(), fmt.Sprintf("sleep vm %q: ", in.name))
			m.procs.recordStopped(ctx, in.name, fmt.Sprintf("sleep failed (%s) and the vm could not be resumed (%v); it boots from its disk when next used", cause, rerr))
		}
		return nil
	})
}

// writeSuspend writes the paused VM's snapshot into tmp, synced, and
// seals its small files (the memory's digests come later, sealLater);
// with memCopy, the RAM file is copied locally meanwhile.
func (o *op) writeSuspend(ctx context.Context, in *instance, tmp storage.Path, memCopy bool) (seal string, err error) {
	m := o.m
	dir, err := m.vol.Path(tmp)
	if err != nil {
		return "", err
	}
	end := phase.Begin(ctx, "vmm snapshot")
	err = m.snaps.snapshotVMM(ctx, in, tmp, memCopy)
	end()
	if err != nil {
		return "", err
	}
	end = phase.Begin(ctx, "sync the snapshot")
	err = atomicfile.SyncTree(dir)
	end()
	if err != nil {
		return "", err
	}
	defer phase.Begin(ctx, "digests of the small files")()
	return m.integrity.sealSmall(ctx, tmp)
}
