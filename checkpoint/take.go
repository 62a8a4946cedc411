package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/storage"
)

// Guest is the running VM a checkpoint is taken of: its VMM and its
// agent, as the orchestrator hands them over.
type Guest interface {
	// Pause and Resume stop and run the vCPUs; Snapshot writes the
	// paused VMM's memory and device state into a directory of the
	// volume.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Snapshot(ctx context.Context, dir storage.Path) error
	// Freeze and Thaw the guest's filesystems (FIFREEZE), so that a disk
	// clone is consistent without a pause. The guest thaws them on its
	// own after a while, should nobody ask: Thaw then returns an error
	// wrapping ErrThawedEarly.
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
}

// ErrThawedEarly is wrapped by Guest.Thaw when the guest had thawed its
// filesystems on its own already: what was copied meanwhile is not
// known to be consistent.
var ErrThawedEarly = errors.New("the guest's filesystems thawed on their own before the thaw")

// ErrLeftPaused is wrapped when a guest paused for a checkpoint could not
// be resumed: the caller must not leave it recorded as running.
var ErrLeftPaused = errors.New("the vm is left paused")

// From says what a checkpoint is taken from.
type From struct {
	// Disk is the VM's disk on the volume.
	Disk storage.Path
	// Guest, when set, is the running VM: memory and disk at one paused
	// instant, or (DiskOnly) its disk with the filesystems frozen.
	Guest Guest
	// Suspend, when set and Guest is not, is the suspend slot of a
	// sleeping VM: its memory, taken as it is (metadata only).
	Suspend storage.Path
	// DiskOnly leaves memory out.
	DiskOnly bool
}

// TakeHooks let the orchestrator watch and test a take.
type TakeHooks struct {
	// Progress receives one line per step.
	Progress func(step string)
	// Crash is called at named steps ("checkpoint-after-snapshot",
	// "checkpoint-before-commit"): tests kill the daemon there.
	Crash func(step string)
	Log   *slog.Logger
}

// Take writes a new checkpoint of rec.VM with id rec.ID from what from
// names, and returns its record (kind, sizes, time filled in). It is
// written into a temporary directory, synced, its small files digested
// (Seal digests the rest later), and renamed into place only when whole:
// a failure or crash leaves no checkpoint. A paused guest is
// always resumed, even when the take fails.
func (s Store) Take(ctx context.Context, rec Record, from From, h TakeHooks) (Record, error) {
	if h.Progress == nil {
		h.Progress = func(string) {}
	}
	if h.Crash == nil {
		h.Crash = func(string) {}
	}
	if h.Log == nil {
		h.Log = slog.Default()
	}
	end := phase.Begin(ctx, "volume: make the directory")
	p, err := s.Begin(ctx, rec.VM, rec.ID)
	end()
	if err != nil {
		return rec, err
	}
	ok := false
	defer func() {
		if !ok {
			p.Abort()
		}
	}()
	rec.Kind = KindMemoryDisk
	switch {
	case from.Guest != nil && from.DiskOnly:
		rec.Kind = KindDiskOnly
		h.Progress("freezing guest filesystems and cloning the disk")
		err = s.frozenClone(ctx, from, p, h)
	case from.Guest != nil:
		h.Progress("pausing, saving memory and cloning the disk")
		err = s.pausedSnapshot(ctx, from, p, h)
	case from.Suspend != "" && !from.DiskOnly:
		h.Progress("copying the suspend slot (metadata only)")
		if err = s.Vol.Clone(ctx, from.Suspend, p.Path(VMMDir)); err == nil {
			err = s.Vol.Clone(ctx, from.Disk, p.Path(DiskFile))
		}
	default:
		// Stopped (or sleeping, disk-only): the disk is at rest.
		rec.Kind = KindDiskOnly
		h.Progress("cloning the disk")
		err = s.Vol.Clone(ctx, from.Disk, p.Path(DiskFile))
	}
	if err != nil {
		return rec, fmt.Errorf("checkpoint vm %q: %w", rec.VM, err)
	}
	// Its sizes are read after (Sizes): a juicefs process each, which
	// the operation does not wait for.
	rec.CreatedAt = time.Now().UTC()
	end = phase.Begin(ctx, "sync the checkpoint")
	err = p.Sync()
	end()
	if err == nil && !s.NoDigests {
		end = phase.Begin(ctx, "digests of the small files")
		rec.Seal, err = p.SealSmall(ctx)
		end()
	}
	if err != nil {
		return rec, err
	}
	h.Crash("checkpoint-before-commit")
	end = phase.Begin(ctx, "commit (rename, record)")
	err = p.Commit(ctx, rec)
	end()
	if err != nil {
		return rec, err
	}
	ok = true
	return rec, nil
}

// Sizes reads the data sizes of a checkpoint's memory and disk (what
// they hold, not their apparent sizes), both at once. Take leaves them
// 0: reading them costs a juicefs process each, which no operation
// waits for.
func (s Store) Sizes(ctx context.Context, vm, id string) (memory, disk int64, err error) {
	dir := Dir(vm, id)
	var wg sync.WaitGroup
	var errs [2]error
	for i, f := range []struct {
		path storage.Path
		to   *int64
	}{{dir.Join(VMMDir), &memory}, {dir.Join(DiskFile), &disk}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := s.Vol.Usage(ctx, f.path)
			if errors.Is(err, fs.ErrNotExist) { // a disk-only checkpoint has no memory
				err = nil
			}
			*f.to, errs[i] = u.Data, err
		}()
	}
	wg.Wait()
	return memory, disk, errors.Join(errs[:]...)
}

// pausedSnapshot pauses the guest, writes the VMM snapshot into the
// pending checkpoint and, at the same time, clones the disk (the VMM
// flushed it, the guest cannot write), and resumes: memory and disk of
// one instant. First the guest writes out what its page cache holds
// (a freeze, thawed at once), so that the disk alone, which den diff
// and restore --path read, has what was written before the checkpoint
// was asked; a guest that cannot is checkpointed all the same (memory
// and disk together are whole).
func (s Store) pausedSnapshot(ctx context.Context, from From, p *Pending, h TakeHooks) (err error) {
	dir := p.Path(VMMDir)
	if err := s.Vol.MkdirAll(ctx, dir); err != nil {
		return err
	}
	end := phase.Begin(ctx, "flush the guest's filesystems")
	if err := from.Guest.Freeze(ctx); err != nil {
		h.Log.Debug("checkpoint: the guest's filesystems not flushed", "err", err)
	} else if err := from.Guest.Thaw(ctx); err != nil {
		h.Log.Warn("checkpoint: thaw after the flush", "err", err)
	}
	end()
	end = phase.Begin(ctx, "pause")
	err = from.Guest.Pause(ctx)
	end()
	if err != nil {
		return err
	}
	defer func() {
		defer phase.Begin(ctx, "resume")()
		if rerr := Resume(context.WithoutCancel(ctx), from.Guest, h.Log); rerr != nil {
			err = errors.Join(err, fmt.Errorf("%w: %w", ErrLeftPaused, rerr))
		}
	}()
	// The disk is cloned while the VMM writes its snapshot: the guest
	// cannot write it, and the VMM flushed it when it paused.
	cloned := make(chan error, 1)
	go func() {
		defer phase.Begin(ctx, "clone disk")()
		cloned <- s.Vol.Clone(ctx, from.Disk, p.Path(DiskFile))
	}()
	end = phase.Begin(ctx, "vmm snapshot")
	err = from.Guest.Snapshot(ctx, dir)
	end()
	end = phase.Begin(ctx, "wait for the disk's clone")
	cerr := <-cloned // the guest stays paused until both are over
	end()
	if err != nil {
		return err
	}
	h.Crash("checkpoint-after-snapshot")
	return cerr
}

// Resume runs a paused guest again, retrying briefly: a VM must never
// stay paused behind an operation that said it was done.
func Resume(ctx context.Context, g Guest, log *slog.Logger) error {
	var err error
	for i := 0; i < 3; i++ {
		if err = g.Resume(ctx); err == nil {
			return nil
		}
		log.Warn("checkpoint: resume", "attempt", i+1, "err", err)
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return err
}

// frozenClone clones the disk with the guest's filesystems frozen, so
// the clone is consistent without pausing the VM. A clone that outlasted
// the freeze (the guest thawed on its own) is refused: it is only
// crash-consistent, and the checkpoint would say otherwise.
func (s Store) frozenClone(ctx context.Context, from From, p *Pending, h TakeHooks) error {
	if err := from.Guest.Freeze(ctx); err != nil {
		return fmt.Errorf("freeze guest filesystems: %w", err)
	}
	start := time.Now()
	err := s.Vol.Clone(ctx, from.Disk, p.Path(DiskFile))
	terr := from.Guest.Thaw(context.WithoutCancel(ctx))
	switch {
	case err != nil:
		return err
	case errors.Is(terr, ErrThawedEarly):
		return fmt.Errorf("clone the disk with the guest's filesystems frozen: the clone took %s, longer than the freeze: %w",
			time.Since(start).Round(time.Millisecond), terr)
	case terr != nil:
		// The clone is whole and was made frozen; the agent thaws by
		// itself after its timeout.
		h.Log.Warn("checkpoint: thaw guest filesystems (the agent thaws by itself)", "err", terr)
	}
	return nil
}
