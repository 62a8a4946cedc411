package machine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// suspendNew is where a new suspend snapshot is written before it
// replaces the VM's suspend slot.
func suspendNew(name string) storage.Path { return storage.VMDir(name).Join("suspend-new") }

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
	tmp := suspendNew(name)
	end := phase.Begin(ctx, "volume: make the slot")
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
	o.resumeOnFailure(ctx, in)
	// The RAM file is copied locally while the snapshot is written: a
	// wake reads that copy (memcopy.go).
	memCopy := m.snaps.startMemCopy(name)
	o.undo.push("drop the local memory copy", func() error {
		memCopy.drop()
		return nil
	})
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
			m.procs.recordStopped(ctx, in.name, fmt.Sprintf("sleep failed (%v) and the vm could not be resumed (%v); it boots from its disk when next used", o.err, rerr))
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

// swapSuspend moves a complete suspend-new into the suspend slot. A crash
// between the two renames leaves no slot and a whole suspend-new, which
// sweepSuspend swaps in.
func (ss *snapshots) swapSuspend(ctx context.Context, name string) error {
	if err := ss.retireSuspend(ctx, name); err != nil {
		return err
	}
	return ss.m.vol.Rename(ctx, suspendNew(name), storage.SuspendDir(name))
}

// retiredPrefix begins the names of obsolete suspend slots waiting, in
// their VM's directory, for their removal (suspend-old-N: each its own,
// so that retiring a slot never waits for an older one's removal).
const retiredPrefix = "suspend-old"

// retireSuspend moves name's suspend slot out of the way, for
// removeRetired to remove once the operation is over: the rename is one
// metadata operation, where the removal of a memory file costs 50-150 ms
// of FUSE and page-cache work, and holds the volume's metadata meanwhile
// (a clone or a rename waits for it). With no slot there is nothing to
// do; a slot that cannot be renamed is removed now. A retired slot a
// crash left behind goes after the next start (sweepSuspend).
func (ss *snapshots) retireSuspend(ctx context.Context, name string) error {
	slot, err := ss.m.vol.Path(storage.SuspendDir(name))
	if err != nil {
		return err
	}
	if _, err := os.Lstat(slot); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	old := storage.VMDir(name).Join(fmt.Sprintf("%s-%d", retiredPrefix, time.Now().UnixNano()))
	if err := ss.m.vol.Rename(ctx, storage.SuspendDir(name), old); err != nil {
		return ss.m.vol.Remove(ctx, storage.SuspendDir(name))
	}
	return nil
}

// removeRetired removes name's retired suspend slots in the background,
// at a low priority: one removal per VM at a time (a call while one runs
// makes it look again when done), and at most two VMs' at once.
func (ss *snapshots) removeRetired(name string) {
	ss.m.retireMu.Lock()
	if ss.m.retiring == nil {
		ss.m.retiring = map[string]bool{}
	}
	if _, running := ss.m.retiring[name]; running {
		ss.m.retiring[name] = true // again, once the running removal is over
		ss.m.retireMu.Unlock()
		return
	}
	ss.m.retiring[name] = false
	ss.m.retireMu.Unlock()
	started := ss.m.goBackground(func() {
		ctx, cancel := ss.m.lifetime()
		defer cancel()
		for {
			select {
			case ss.m.removals <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() == nil {
				// Niced only once its turn has come: a start's removals
				// wait without an OS thread each.
				lowPriority()
				ss.removeRetiredNow(ctx, name)
				<-ss.m.removals
			}
			ss.m.retireMu.Lock()
			again := ss.m.retiring[name] && ctx.Err() == nil
			if !again {
				delete(ss.m.retiring, name)
			} else {
				ss.m.retiring[name] = false
			}
			ss.m.retireMu.Unlock()
			if !again {
				return
			}
		}
	})
	if !started {
		ss.m.retireMu.Lock()
		delete(ss.m.retiring, name)
		ss.m.retireMu.Unlock()
	}
}

// removeRetiredNow removes name's retired suspend slots.
func (ss *snapshots) removeRetiredNow(ctx context.Context, name string) {
	dir, err := ss.m.vol.Path(storage.VMDir(name))
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), retiredPrefix) {
			continue
		}
		if err := ss.m.vol.Remove(ctx, storage.VMDir(name).Join(e.Name())); err != nil {
			ss.m.log.Debug("den: remove a retired suspend slot", "vm", name, "err", err)
		}
	}
}

// Wake restores a sleeping VM from its suspend slot and waits for its
// agent; a running VM is left as it is.
func (m *Manager) Wake(ctx context.Context, name string) error {
	_, err := m.ensureRunning(ctx, name, "", false)
	return err
}

// wake restores the sleeping VM. The suspend slot stays until the next
// sleep replaces it (a VMM restoring memory lazily reads it for as long
// as the VM runs).
func (o *op) wake(ctx context.Context) error {
	m, vm, seal := o.m, o.vm, o.spec.SuspendSeal
	// The memory is verified while the VMM starts: the local copy of it
	// when there is one, which is then what the VMM reads.
	ref := m.snaps.withLocalMemory(suspendRef(vm.Name, seal), suspendKey(seal, vm.Generation))
	check := func(ctx context.Context) error {
		if err := m.integrity.verify(ctx, ref, vm.VMM); err != nil {
			return fmt.Errorf("%w; it stays asleep: restore a checkpoint (den checkpoints %s)", err, vm.Name)
		}
		return nil
	}
	in, err := o.restoreInto(ctx, restoreSource{snapDir: ref.dir, local: ref.local, check: check})
	if err != nil {
		if errors.Is(err, errGuestRan) {
			m.snaps.dropRunSlot(ctx, vm.Name, err)
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
	ss.m.memc.drop(name, "suspend-")
	if err := ss.m.vol.Remove(ctx, storage.SuspendDir(name)); err != nil {
		ss.m.log.Warn("den: remove the suspend slot of a wake that failed after the guest ran", "vm", name, "err", err)
	}
	ss.m.procs.recordStopped(ctx, name, "wake failed after the guest ran ("+cause.Error()+"); it boots from its disk when next used")
}
