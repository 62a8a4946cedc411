package machine

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/fsdiff"
)

// DiffOptions names the two disks a diff compares: checkpoint From of
// FromVM and checkpoint To of ToVM, or ToVM's current state when To is
// empty.
type DiffOptions struct {
	FromVM, From string
	ToVM, To     string
	fsdiff.Options
}

// DiffResult is a diff and the checkpoints it compared.
type DiffResult struct {
	fsdiff.Result
	From, To string
	// Taken says To is a disk-only checkpoint taken for this diff.
	Taken bool
}

// diffDir holds the diffs' mount points.
func (s StateDir) diffDir() string { return filepath.Join(string(s), "diff") }

// Diff compares two checkpoints' disk images on the host, read-only,
// without touching either VM. For a current state it first takes a
// disk-only checkpoint (a running VM's filesystems are frozen for the
// instant of the clone; a sleeping or stopped VM is not woken).
func (m *Manager) Diff(ctx context.Context, o DiffOptions, progress Progress) (DiffResult, error) {
	if progress == nil {
		progress = func(string) {}
	}
	res := DiffResult{From: o.From, To: o.To}
	from, err := m.checkpointDisk(ctx, o.FromVM, o.From)
	if err != nil {
		return res, err
	}
	if o.To == "" {
		progress(fmt.Sprintf("taking a disk-only checkpoint of vm %q's current state", o.ToVM))
		cp, err := m.Checkpoint(ctx, o.ToVM, CheckpointOptions{DiskOnly: true, Comment: "den diff: current state"}, progress)
		if err != nil {
			return res, err
		}
		res.To, res.Taken = cp.ID, true
		progress(fmt.Sprintf("compared with %s, a disk-only checkpoint of vm %q taken now", cp.ID, o.ToVM))
	}
	to, err := m.checkpointDisk(ctx, o.ToVM, res.To)
	if err != nil {
		return res, err
	}
	o.Options.TmpDir = m.cfg.State.diffDir()
	r, err := fsdiff.Images(ctx, from, to, o.Options)
	if err != nil {
		return res, fmt.Errorf("diff %s@%s %s@%s: %w", o.FromVM, o.From, o.ToVM, res.To, err)
	}
	res.Result = r
	return res, nil
}

// sweepDiffs undoes the mounts of diffs a daemon that stopped mid-diff
// left behind.
func (m *Manager) sweepDiffs() {
	if err := fsdiff.Sweep(m.cfg.State.diffDir()); err != nil {
		m.log.Warn("den: diff mounts left behind", "err", err)
	}
}

// checkpointDisk is the host path of a checkpoint's disk image, to be
// read only. A VM not the context's owner's is not found.
func (m *Manager) checkpointDisk(ctx context.Context, vm, id string) (string, error) {
	rec, err := m.get(ctx, vm)
	if err != nil {
		return "", err
	}
	if owner, _ := ctx.Value(ownerKey{}).(string); owner != "" && rec.Owner != owner {
		return "", fmt.Errorf("no vm named %q: %w", vm, ErrNotFound)
	}
	if _, err := m.getCheckpoint(ctx, vm, id); err != nil {
		return "", err
	}
	return m.vol.Path(checkpoint.Dir(vm, id).Join(checkpoint.DiskFile))
}
