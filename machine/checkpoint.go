package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// CheckpointOptions tunes Checkpoint.
type CheckpointOptions struct {
	Comment string
	// DiskOnly freezes the guest's filesystems and clones the disk,
	// without memory: restoring it boots.
	DiskOnly bool
	// Keep, when > 0, deletes the oldest checkpoints beyond the newest
	// Keep afterwards (never the VM's head).
	Keep int
}

func (ss *snapshots) store() checkpoint.Store {
	return checkpoint.Store{Vol: ss.m.vol, NoDigests: ss.m.cfg.NoDigests}
}

// Checkpoint saves a VM's memory and disk at one paused instant (or its
// disk only) as a new checkpoint and returns it. A sleeping VM is
// checkpointed from its suspend slot, a stopped one disk-only.
func (m *Manager) Checkpoint(ctx context.Context, name string, opts CheckpointOptions, progress Progress) (_ registry.Checkpoint, err error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := validate.Comment(opts.Comment); err != nil {
		return registry.Checkpoint{}, fmt.Errorf("checkpoint vm %q: %w", name, err)
	}
	o, err := m.begin(ctx, name, "checkpoint")
	if err != nil {
		return registry.Checkpoint{}, err
	}
	defer func() { o.end(err) }()
	cp, err := o.checkpoint(ctx, opts, progress)
	if err != nil {
		return cp, err
	}
	if opts.Keep > 0 {
		if err := m.snaps.prune(ctx, name, opts.Keep); err != nil {
			m.log.Warn("den: retention", "vm", name, "err", err)
		}
	}
	return cp, nil
}

// checkpoint takes a checkpoint of the VM and makes it the head.
func (o *op) checkpoint(ctx context.Context, opts CheckpointOptions, progress Progress) (registry.Checkpoint, error) {
	m, vm, sp := o.m, o.vm, o.spec
	seq, err := m.db.NextCheckpointSeq(ctx, vm.Name)
	if err != nil {
		return registry.Checkpoint{}, err
	}
	id := checkpoint.ID(seq)
	in := o.instance()
	running := vm.State == registry.StateRunning && in != nil && alive(in)
	need := int64(0)
	if running && !opts.DiskOnly {
		need = m.guard.memorySnapshotNeed(vm)
	}
	if err := m.guard.needSpace(need, fmt.Sprintf("checkpoint vm %q", vm.Name)); err != nil {
		return registry.Checkpoint{}, err
	}
	mark := vmEvent(activity.EventCheckpoint, id, "")
	if running {
		// The record up to the checkpoint's instant, and where a restore
		// to it reads the guest's record on from (what the guest records
		// between this read and the pause is in its memory, and read
		// after such a restore).
		mark.Cursor = m.records.pullBefore(ctx, vm.Name, in)
	}
	rec := checkpoint.Record{VM: vm.Name, ID: id, Seq: seq, Parent: sp.Head, Comment: opts.Comment, VMM: vm.VMM}
	var memCopy *memCopyJob // the RAM file's local copy, made while paused
	from := checkpoint.From{Disk: storage.VMDisk(vm.Name), DiskOnly: opts.DiskOnly}
	switch {
	case running:
		from.Guest = guestOf{m: m, in: in, mem: &memCopy, frozen: &frozen{}}
	case vm.State == registry.StateSleeping:
		from.Suspend = storage.SuspendDir(vm.Name)
		if !opts.DiskOnly {
			// The slot is copied as it is: damage must not pass into
			// a checkpoint (and a fork) with new digests.
			if err := m.integrity.verify(ctx, suspendRef(vm.Name, sp.SuspendSeal), vm.VMM); err != nil {
				return registry.Checkpoint{}, fmt.Errorf("checkpoint vm %q: %w", vm.Name, err)
			}
		}
	}
	rec, err = m.snaps.store().Take(ctx, rec, from, checkpoint.TakeHooks{Progress: progress, Crash: crashpoint, Log: m.log})
	if err == nil {
		key := checkpointKey(id, rec.Seal)
		memCopy.keep(key)
		if in != nil && rec.Kind == checkpoint.KindMemoryDisk {
			// The RAM equals the checkpoint's memory now: the next
			// snapshot shares with it (memkept.go), or is written over
			// it (delta.go).
			local := ""
			if memCopy != nil {
				local = m.snaps.memc.local(vm.Name, key)
			}
			m.snaps.setOrigin(in, checkpoint.Dir(vm.Name, id).Join(checkpoint.VMMDir), local)
		}
	} else {
		memCopy.drop()
	}
	if errors.Is(err, checkpoint.ErrLeftPaused) && in != nil {
		// Never a paused VM recorded as running: stop it and say so.
		in.close(true)
		m.procs.stopInstance(ctx, in, stopQuit)
		m.procs.recordStopped(ctx, vm.Name, "checkpoint failed and the vm could not be resumed ("+err.Error()+"); it boots from its disk when next used")
	}
	if err != nil {
		return rec, err
	}
	if err := m.db.AddCheckpoint(ctx, rec); err != nil {
		return rec, err
	}
	if rec.Kind != checkpoint.KindMemoryDisk {
		mark.Detail = "disk only"
	}
	m.records.mark(vm.Name, mark)
	m.snaps.sizesLater(vm.Name, id)
	m.integrity.sealLater(checkpoint.Dir(vm.Name, id), m.snaps.withLocalMemory(checkpointRef(rec), checkpointKey(id, rec.Seal)))
	// No spare disk is made for it here (spares.go): its clone would
	// compete with whatever operation comes next, and a restore right
	// after the checkpoint gains nothing by it. The first restore to it
	// makes one, for the next.
	if err := o.update(ctx, func(_ *registry.VM, sp *spec) error {
		sp.Head = id
		return nil
	}); err != nil {
		return rec, err
	}
	return rec, nil
}

// sizesLater reads a new checkpoint's data sizes in the background and
// records them (den checkpoints shows them; nothing waits for them),
// once operations pause for sizesSettle: JuiceFS lists every chunk of
// the memory and of the disk for them, and compacts the chunks it finds
// in many slices, which slows the operation that comes next (a restore
// to the checkpoint, typically).
func (ss *snapshots) sizesLater(vm, id string) {
	key := vm + "/" + id
	if _, dup := ss.sizing.LoadOrStore(key, true); dup {
		return // asked already: a listing asks again until they are read
	}
	if !ss.m.goBackground(func() {
		defer ss.sizing.Delete(key)
		ctx, cancel := ss.m.lifetime()
		defer cancel()
		ss.m.locks.waitQuiet(ctx, sizesSettle, sizesWaitMax)
		mem, disk, err := ss.store().Sizes(ctx, vm, id)
		if err != nil {
			ss.m.log.Debug("den: checkpoint sizes", "vm", vm, "checkpoint", id, "err", err)
			return
		}
		if host, err := ss.m.vol.Path(checkpoint.Dir(vm, id).Join(checkpoint.VMMDir)); err == nil {
			if kept, ok := keptBytes(host); ok {
				mem += kept // the data its manifest names, in the memory store
			}
		}
		if err := ss.m.db.SetCheckpointSizes(ctx, vm, id, mem, disk); err != nil {
			ss.m.log.Debug("den: checkpoint sizes", "vm", vm, "checkpoint", id, "err", err)
		}
	}) {
		ss.sizing.Delete(key)
	}
}

// sizesSettle is how long operations pause before a checkpoint's sizes
// are read; sizesWaitMax bounds the wait on a host never quiet.
const (
	sizesSettle  = 2 * time.Second
	sizesWaitMax = time.Minute
)

// guestOf is a running VM as the checkpoint package takes it: its VMM
// and its agent.
type guestOf struct {
	m  *Manager
	in *instance
	// mem, when set, receives the local copy of the RAM file that
	// Snapshot makes beside the volume's (memcopy.go).
	mem **memCopyJob
	// frozen, when set, is what Freeze froze, and when.
	frozen *frozen
}

// frozen is what a guest's Freeze froze, and when it was asked.
type frozen struct {
	mounts int
	at     time.Time
}

// freezeWindow is how long the guest's agent keeps its filesystems
// frozen for a disk-only checkpoint unless thawed first: a bound on
// what a den that died mid-checkpoint leaves frozen.
var freezeWindow = 30 * time.Second

func (g guestOf) Pause(ctx context.Context) error  { return g.in.hv.Pause(ctx) }
func (g guestOf) Resume(ctx context.Context) error { return g.in.hv.Resume(ctx) }

// Snapshot writes the paused VM's snapshot (over its last one's memory,
// delta.go) and, when asked, a local copy of its memory at the same
// time; the VM stays paused until both are whole.
func (g guestOf) Snapshot(ctx context.Context, dir storage.Path) error {
	var job *memCopyJob
	if g.mem != nil {
		job = g.m.snaps.startMemCopy(g.in.name)
		*g.mem = job
	}
	err := g.m.snaps.snapshotVMM(ctx, g.in, dir, job != nil)
	end := phase.Begin(ctx, "wait for the local memory copy")
	job.wait()
	end()
	return err
}

func (g guestOf) Freeze(ctx context.Context) error {
	c, err := g.m.agents.agentClient(ctx, g.in)
	if err != nil {
		return err
	}
	at := time.Now()
	r, err := c.Freeze(ctx, freezeWindow)
	if err == nil && g.frozen != nil {
		*g.frozen = frozen{mounts: len(r.Frozen), at: at}
	}
	return err
}

func (g guestOf) Thaw(ctx context.Context) error {
	c, err := g.m.agents.agentClient(ctx, g.in)
	if err != nil {
		return err
	}
	r, err := c.Thaw(ctx)
	if err != nil || g.frozen == nil || g.frozen.mounts == 0 {
		return err
	}
	// The agent's own thaw came first (it thawed nothing now), or may
	// have: its timer started after this host's clock did.
	if since := time.Since(g.frozen.at); len(r.Thawed) == 0 || since >= freezeWindow {
		return fmt.Errorf("%s after the freeze, which lasts %s: %w", since.Round(time.Millisecond), freezeWindow, checkpoint.ErrThawedEarly)
	}
	return nil
}

// Checkpoints lists a VM's checkpoints (oldest first) and its head.
func (m *Manager) Checkpoints(ctx context.Context, name string) ([]registry.Checkpoint, string, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return nil, "", err
	}
	sp, err := decodeSpec(vm)
	if err != nil {
		return nil, "", err
	}
	cps, err := m.db.ListCheckpoints(ctx, name)
	for i := range cps {
		cps[i].Damaged = m.snaps.store().Damaged(name, cps[i].ID)
		if cps[i].MemoryBytes == 0 && cps[i].DiskBytes == 0 {
			m.snaps.sizesLater(name, cps[i].ID) // a stop came before they were read
		}
	}
	return cps, sp.Head, err
}

// getCheckpoint reads a checkpoint's row and checks its directory is
// complete on the volume.
func (m *Manager) getCheckpoint(ctx context.Context, vm, id string) (registry.Checkpoint, error) {
	if err := checkpoint.ValidateID(id); err != nil {
		return registry.Checkpoint{}, err
	}
	cp, err := m.db.GetCheckpoint(ctx, vm, id)
	if errors.Is(err, registry.ErrNotFound) {
		return cp, fmt.Errorf("vm %q has no checkpoint %s (see den checkpoints %s): %w", vm, id, vm, ErrNotFound)
	}
	if err != nil {
		return cp, err
	}
	if _, err := m.snaps.store().Meta(vm, id); err != nil {
		return cp, fmt.Errorf("%w: %w", err, ErrConflict)
	}
	return cp, nil
}

// DeleteCheckpoint removes a checkpoint and reclaims its space; its id
// is not given out again (registry.CheckpointStore). Deleting the VM's
// head makes the checkpoint's parent the head.
func (m *Manager) DeleteCheckpoint(ctx context.Context, name, id string) (err error) {
	o, err := m.begin(ctx, name, "delete checkpoint "+id)
	if err != nil {
		return err
	}
	defer func() { o.end(err) }()
	if err := checkpoint.ValidateID(id); err != nil {
		return err
	}
	cp, err := m.db.GetCheckpoint(ctx, name, id)
	if errors.Is(err, registry.ErrNotFound) {
		return fmt.Errorf("vm %q has no checkpoint %s: %w", name, id, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if o.spec.Restoring == id {
		return fmt.Errorf("delete checkpoint %s of %q: an interrupted restore to it is still to be finished (reach the vm first): %w", id, name, ErrConflict)
	}
	return o.dropCheckpoint(ctx, cp)
}

// dropCheckpoint removes one of the VM's checkpoints; the head moves to
// its parent, as the children do: the next checkpoint descends from a
// checkpoint that exists.
func (o *op) dropCheckpoint(ctx context.Context, cp registry.Checkpoint) error {
	if o.spec.Head == cp.ID {
		if err := o.update(ctx, func(_ *registry.VM, sp *spec) error {
			sp.Head = cp.Parent
			return nil
		}); err != nil {
			return err
		}
	}
	return o.m.snaps.deleteCheckpoint(ctx, o.name(), cp.ID)
}

func (ss *snapshots) deleteCheckpoint(ctx context.Context, name, id string) error {
	// The directory is retired first, then the row goes, then the files:
	// a crash anywhere leaves neither a row without its files nor files
	// that the next start would list again.
	if err := ss.store().Retire(ctx, name, id); err != nil {
		return err
	}
	crashpoint("checkpoint-rm-after-retire")
	ss.memc.drop(name, id+"-")
	ss.spares.dropCheckpoint(ctx, name, id)
	if err := ss.m.db.DeleteCheckpoint(ctx, name, id); err != nil && !errors.Is(err, registry.ErrNotFound) {
		return err
	}
	if err := ss.store().RemoveRetired(ctx, name, id); err != nil {
		return fmt.Errorf("delete checkpoint %s of %q: %w", id, name, err)
	}
	ss.m.gc.poke() // its memory's extents may be named by nothing now
	return nil
}

// prune applies a retention of keep checkpoints.
func (ss *snapshots) prune(ctx context.Context, name string, keep int) error {
	cps, head, err := ss.m.Checkpoints(ctx, name)
	if err != nil {
		return err
	}
	for _, id := range checkpoint.Prune(cps, keep, map[string]bool{head: true}) {
		if err := ss.deleteCheckpoint(ctx, name, id); err != nil {
			return err
		}
	}
	return nil
}

// sweepCheckpoints matches a VM's checkpoint directories with its catalog
// after a restart: unfinished directories go, complete directories whose
// row a crash lost are recorded again.
func (su *startup) sweepCheckpoints(ctx context.Context, name string) {
	rows, deleted, err := su.m.snaps.store().Sweep(ctx, name)
	if err != nil {
		su.m.log.Warn("den: sweep checkpoints", "vm", name, "err", err)
		return
	}
	o, err := su.m.owned(ctx, name)
	if err != nil {
		su.m.log.Warn("den: sweep checkpoints", "vm", name, "err", err)
		return
	}
	for _, id := range deleted {
		// A deletion a crash cut short after it retired the files: the
		// row goes too (and the head moves to its parent).
		if cp, err := su.m.db.GetCheckpoint(ctx, name, id); err == nil {
			if err := o.dropCheckpoint(ctx, cp); err != nil {
				su.m.log.Warn("den: finish an interrupted checkpoint deletion", "vm", name, "checkpoint", id, "err", err)
			}
		}
	}
	headSeq := 0
	if o.spec.Head != "" {
		if cp, err := su.m.db.GetCheckpoint(ctx, name, o.spec.Head); err == nil {
			headSeq = cp.Seq
		}
	}
	for _, row := range rows {
		if _, err := su.m.db.GetCheckpoint(ctx, name, row.ID); errors.Is(err, registry.ErrNotFound) {
			// A checkpoint whose row a crash lost (between its rename
			// into place and its row): recorded again, and the head when
			// it is newer than the head.
			if err := su.m.db.AddCheckpoint(ctx, row); err == nil && row.Seq > headSeq {
				_ = o.update(ctx, func(_ *registry.VM, sp *spec) error {
					sp.Head = row.ID
					return nil
				})
				headSeq = row.Seq
			}
		}
	}
}
