package machine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/denhq/den/fsdiff"
	"github.com/denhq/den/pathrestore"
	"github.com/denhq/den/storage"
)

// RestorePathsOptions names what RestorePaths puts back: Paths (absolute,
// none of them /) of VM, as checkpoint Checkpoint holds them.
type RestorePathsOptions struct {
	VM, Checkpoint string
	Paths          []string
}

// RestorePathsResult is what a RestorePaths did, and the disk-only
// checkpoint that holds the VM's state from before it.
type RestorePathsResult struct {
	Saved   string
	Actions []pathrestore.Action
}

// RestorePaths puts paths of a VM back as a checkpoint holds them, in the
// running guest (woken or started if need be), through its agent, and
// leaves everything else alone: a disk-only checkpoint of the current
// state is taken first (what it put back can be had again from it); the
// two disks are compared under each path; the checkpoint's disk, mounted
// read-only on the host, gives what the guest gets back.
func (m *Manager) RestorePaths(ctx context.Context, o RestorePathsOptions, progress Progress) (RestorePathsResult, error) {
	var res RestorePathsResult
	if progress == nil {
		progress = func(string) {}
	}
	if len(o.Paths) == 0 {
		return res, fmt.Errorf("restore paths of vm %q: no path given: %w", o.VM, ErrInvalid)
	}
	prefixes := make([]string, 0, len(o.Paths))
	for _, p := range o.Paths {
		prefix, err := fsdiff.CleanPrefix(p)
		if err != nil {
			return res, fmt.Errorf("restore paths of vm %q: %w: %w", o.VM, err, ErrInvalid)
		}
		if prefix == "/" {
			return res, fmt.Errorf("restore paths of vm %q: / is the whole disk: den restore %s %s puts the whole VM back: %w", o.VM, o.VM, o.Checkpoint, ErrInvalid)
		}
		prefixes = append(prefixes, prefix)
	}
	prefixes = pathrestore.Prefixes(prefixes)
	var changes []fsdiff.Change
	for _, prefix := range prefixes {
		d, err := m.Diff(ctx, DiffOptions{FromVM: o.VM, From: o.Checkpoint, ToVM: o.VM, To: res.Saved, Options: fsdiff.Options{Prefix: prefix}}, progress)
		if err != nil {
			return res, err
		}
		res.Saved = d.To
		changes = append(changes, d.Changes...)
	}
	if len(changes) == 0 {
		progress("nothing differs from " + o.Checkpoint)
		return res, nil
	}
	paths := map[string]storage.Path{}
	image, err := m.diffs.checkpointDisk(ctx, o.VM, o.Checkpoint, paths)
	if err != nil {
		return res, err
	}
	mnt, err := fsdiff.Open(ctx, image, fsdiff.Options{TmpDir: m.cfg.State.diffDir(), Copy: func(ctx context.Context, image string) (string, func(), error) {
		return m.diffs.copy(ctx, paths[image])
	}})
	if err != nil {
		return res, fmt.Errorf("restore paths of vm %q: %w", o.VM, err)
	}
	defer mnt.Close()
	sess, err := m.Open(ctx, o.VM, "")
	if err != nil {
		return res, err
	}
	defer sess.Release()
	c, err := m.agents.agentClient(ctx, sess.in)
	if err != nil {
		return res, fmt.Errorf("restore paths of vm %q: %w", o.VM, err)
	}
	fs, err := c.SFTP()
	if err != nil {
		return res, fmt.Errorf("restore paths of vm %q: %w", o.VM, err)
	}
	defer fs.Close()
	slices.SortFunc(changes, func(a, b fsdiff.Change) int { return strings.Compare(a.Path, b.Path) })
	for _, prefix := range prefixes {
		acts, err := pathrestore.Parents(fs, mnt.Root, prefix)
		res.Actions = append(res.Actions, acts...)
		if err != nil {
			return res, fmt.Errorf("restore paths of vm %q from %s (the state before is %s): %w", o.VM, o.Checkpoint, res.Saved, err)
		}
	}
	progress(fmt.Sprintf("putting back %d path(s) from %s", len(changes), o.Checkpoint))
	acts, err := pathrestore.Apply(ctx, fs, mnt.Root, changes)
	res.Actions = append(res.Actions, acts...)
	if err != nil {
		return res, fmt.Errorf("restore paths of vm %q from %s (after %d change(s); the state before is %s): %w", o.VM, o.Checkpoint, len(res.Actions), res.Saved, err)
	}
	return res, errors.Join(mnt.Close())
}
