package machine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/fsdiff"
	"github.com/denhq/den/storage"
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
	paths := map[string]storage.Path{} // host path -> volume path
	from, err := m.diffs.checkpointDisk(ctx, o.FromVM, o.From, paths)
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
	to, err := m.diffs.checkpointDisk(ctx, o.ToVM, res.To, paths)
	if err != nil {
		return res, err
	}
	o.Options.TmpDir = m.cfg.State.diffDir()
	o.Options.Copy = func(ctx context.Context, image string) (string, func(), error) {
		return m.diffs.copy(ctx, paths[image])
	}
	r, err := fsdiff.Images(ctx, from, to, o.Options)
	if err != nil {
		return res, fmt.Errorf("diff %s@%s %s@%s: %w", o.FromVM, o.From, o.ToVM, res.To, err)
	}
	res.Result = r
	return res, nil
}

// diffs are the disk images den diff reads, and the mounts and copies
// it makes of them.
type diffs struct{ m *Manager }

// sweep undoes the mounts of diffs a daemon that stopped mid-diff
// left behind.
func (d diffs) sweep() {
	m := d.m
	if err := fsdiff.Sweep(m.cfg.State.diffDir()); err != nil {
		m.log.Warn("den: diff mounts left behind", "err", err)
	}
}

// copy clones a checkpoint's disk beside the VM's checkpoints, under
// a tmp- name (a crash leaves it to the checkpoints' sweep), for a diff
// to replay its journal into: a memory checkpoint's disk was cloned
// while the guest ran. The clone costs metadata only.
func (d diffs) copy(ctx context.Context, src storage.Path) (string, func(), error) {
	m := d.m
	if src == "" {
		return "", nil, errors.New("no checkpoint disk to copy")
	}
	var b [8]byte
	rand.Read(b[:])
	dst := src.Dir().Dir().Join(fmt.Sprintf("tmp-diff-%x", b))
	if err := m.vol.Clone(ctx, src, dst); err != nil {
		return "", nil, err
	}
	remove := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.vol.Remove(ctx, dst); err != nil {
			m.log.Warn("den: diff: remove a disk copy", "path", dst, "err", err)
		}
	}
	host, err := m.vol.Path(dst)
	if err != nil {
		remove()
		return "", nil, err
	}
	return host, remove, nil
}

// checkpointDisk is the host path of a checkpoint's disk image, to be
// read only, noted in paths with its volume path. A VM not the
// context's owner's is not found.
func (d diffs) checkpointDisk(ctx context.Context, vm, id string, paths map[string]storage.Path) (string, error) {
	m := d.m
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
	p := checkpoint.Dir(vm, id).Join(checkpoint.DiskFile)
	host, err := m.vol.Path(p)
	if err != nil {
		return "", err
	}
	paths[host] = p
	return host, nil
}
