// Package fsdiff compares two ext4 disk images, read-only: each is
// mounted on a read-only loop device without replaying its journal, the
// two trees' inode metadata (size, mtime, ctime, inode number and
// generation) are compared first, and file content is read only where
// the metadata differs.
package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// File types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeFIFO    = "fifo"
	TypeSocket  = "socket"
	TypeChar    = "char"
	TypeBlock   = "block"
)

// Operations of a Change.
const (
	Added   = "added"
	Removed = "removed"
	Changed = "changed"
)

// What changed about a path present on both sides.
const (
	WhatType    = "type"
	WhatContent = "content"
	WhatMode    = "mode"
	WhatOwner   = "owner"
	WhatTarget  = "target"
	WhatDevice  = "device"
)

// File is a path's inode as a diff shows it.
type File struct {
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   string    `json:"mode"` // permission bits, octal
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Target string    `json:"target,omitempty"` // a symlink's
	Links  uint64    `json:"links"`
	MTime  time.Time `json:"mtime"`
}

// Change is one path added, removed or changed.
type Change struct {
	Path string   `json:"path"`
	Op   string   `json:"op"`
	Old  *File    `json:"old,omitempty"`
	New  *File    `json:"new,omitempty"`
	What []string `json:"what,omitempty"`
	// LinkOf is, for an added hard link, another path of its inode.
	LinkOf string `json:"link_of,omitempty"`
	// MovedFrom is, for an added path, the removed path whose inode it
	// is (a rename).
	MovedFrom string `json:"moved_from,omitempty"`
	// Binary marks file content that is not text (no patch).
	Binary bool `json:"binary,omitempty"`
	// Patch is a unified diff of a text file's content (Options.Patch).
	Patch string `json:"patch,omitempty"`
	// NoPatch says why a text file has no patch (too large).
	NoPatch string `json:"no_patch,omitempty"`
}

// Summary counts the changes. Bytes are those of regular files: the
// added files' sizes, the removed files' sizes, and the changed files'
// growth (negative when they shrank).
type Summary struct {
	Added        int   `json:"added"`
	Removed      int   `json:"removed"`
	Changed      int   `json:"changed"`
	AddedBytes   int64 `json:"added_bytes"`
	RemovedBytes int64 `json:"removed_bytes"`
	ChangedBytes int64 `json:"changed_bytes"`
}

// Result is a diff: its changes in path order and their summary.
type Result struct {
	Changes []Change `json:"changes"`
	Summary Summary  `json:"summary"`
}

// Options tunes a diff.
type Options struct {
	// Prefix limits the diff to this path and what is under it ("" or
	// "/": everything).
	Prefix string
	// Patch asks for unified diffs of text files.
	Patch bool
	// TmpDir holds the mount points ("": the system's).
	TmpDir string
	// Copy makes a throwaway copy of an image (a clone), for an image
	// whose journal must be replayed before it is read; remove deletes
	// it. Nil: such an image is refused.
	Copy func(ctx context.Context, image string) (copy string, remove func(), err error)
}

// Limits of patches: a file larger than patchFileMax has none, and
// patches stop once they add up to patchTotalMax.
const (
	patchFileMax  = 1 << 20
	patchTotalMax = 16 << 20
)

// Images compares the ext4 filesystems in two image files, mounting
// each read-only for the duration of the call.
func Images(ctx context.Context, oldImage, newImage string, opts Options) (Result, error) {
	a, err := Open(ctx, oldImage, opts)
	if err != nil {
		return Result{}, err
	}
	defer a.Close()
	b, err := Open(ctx, newImage, opts)
	if err != nil {
		return Result{}, err
	}
	defer b.Close()
	res, err := Trees(ctx, a.Root, b.Root, opts)
	if err != nil {
		return Result{}, err
	}
	// A mount that cannot be undone is an error of the call: it is
	// not left behind silently.
	if err := errors.Join(b.Close(), a.Close()); err != nil {
		return Result{}, err
	}
	return res, nil
}

// CleanPrefix makes a path prefix absolute and clean; it refuses one
// with a ".." element rather than guess what it meant.
func CleanPrefix(p string) (string, error) {
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", fmt.Errorf("path %q: \"..\" is not allowed", p)
		}
	}
	return path.Clean("/" + p), nil
}

// Trees compares the filesystems mounted at oldRoot and newRoot.
func Trees(ctx context.Context, oldRoot, newRoot string, opts Options) (Result, error) {
	prefix, err := CleanPrefix(opts.Prefix)
	if err != nil {
		return Result{}, err
	}
	a, err := walk(ctx, oldRoot, prefix)
	if err != nil {
		return Result{}, fmt.Errorf("diff: %w", err)
	}
	b, err := walk(ctx, newRoot, prefix)
	if err != nil {
		return Result{}, fmt.Errorf("diff: %w", err)
	}
	d := &differ{ctx: ctx, opts: opts}
	for p, o := range a {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		n, ok := b[p]
		if !ok {
			d.add(Change{Path: p, Op: Removed, Old: &o.File}, o, nil)
			continue
		}
		what, err := d.compare(o, n)
		if err != nil {
			return Result{}, err
		}
		if len(what) > 0 {
			d.add(Change{Path: p, Op: Changed, Old: &o.File, New: &n.File, What: what}, o, n)
		}
	}
	for p, n := range b {
		if _, ok := a[p]; !ok {
			d.add(Change{Path: p, Op: Added, New: &n.File}, nil, n)
		}
	}
	sort.Slice(d.res.Changes, func(i, j int) bool { return d.res.Changes[i].Path < d.res.Changes[j].Path })
	if err := d.links(a, b); err != nil {
		return Result{}, err
	}
	if opts.Patch {
		for i := range d.res.Changes {
			if err := d.patch(&d.res.Changes[i], a, b); err != nil {
				return Result{}, err
			}
		}
	}
	if d.res.Changes == nil {
		d.res.Changes = []Change{}
	}
	return d.res, nil
}

type differ struct {
	ctx        context.Context
	opts       Options
	res        Result
	patchBytes int
}

func (d *differ) add(c Change, o, n *entry) {
	s := &d.res.Summary
	switch c.Op {
	case Added:
		s.Added++
		if n.Type == TypeFile {
			s.AddedBytes += n.Size
		}
	case Removed:
		s.Removed++
		if o.Type == TypeFile {
			s.RemovedBytes += o.Size
		}
	case Changed:
		s.Changed++
		switch {
		case o.Type == TypeFile && n.Type == TypeFile:
			s.ChangedBytes += n.Size - o.Size
		case n.Type == TypeFile:
			s.ChangedBytes += n.Size
		case o.Type == TypeFile:
			s.ChangedBytes -= o.Size
		}
	}
	d.res.Changes = append(d.res.Changes, c)
}

// compare says what differs between a path's two inodes. Timestamps
// alone are no change; they only decide whether content is read.
func (d *differ) compare(o, n *entry) ([]string, error) {
	if o.Type != n.Type {
		return []string{WhatType}, nil
	}
	var what []string
	switch o.Type {
	case TypeFile:
		same, err := sameContent(d.ctx, o, n)
		if err != nil {
			return nil, err
		}
		if !same {
			what = append(what, WhatContent)
		}
	case TypeSymlink:
		if o.Target != n.Target {
			what = append(what, WhatTarget)
		}
	case TypeChar, TypeBlock:
		if o.rdev != n.rdev {
			what = append(what, WhatDevice)
		}
	}
	if o.Mode != n.Mode {
		what = append(what, WhatMode)
	}
	if o.UID != n.UID || o.GID != n.GID {
		what = append(what, WhatOwner)
	}
	return what, nil
}

// sameContent says whether two regular files hold the same bytes: by
// their inodes when both are the same unmodified inode (number,
// generation, size, mtime and ctime alike: a clone of the image shares
// them), else by reading both.
func sameContent(ctx context.Context, o, n *entry) (bool, error) {
	if o.Size != n.Size {
		return false, nil
	}
	if o.ino == n.ino && o.ctime == n.ctime && o.mtime == n.mtime {
		og, err := generation(o.fsys)
		if err != nil {
			return false, err
		}
		ng, err := generation(n.fsys)
		if err != nil {
			return false, err
		}
		if og == ng {
			return true, nil
		}
	}
	return equalFiles(ctx, o.fsys, n.fsys)
}

// equalFiles compares two files' bytes, until ctx ends.
func equalFiles(ctx context.Context, a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	const chunk = 1 << 20
	ba, bb := make([]byte, chunk), make([]byte, chunk)
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		na, erra := io.ReadFull(fa, ba)
		nb, errb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if erra == io.EOF || erra == io.ErrUnexpectedEOF {
			return errb == io.EOF || errb == io.ErrUnexpectedEOF, nil
		}
		if erra != nil {
			return false, erra
		}
		if errb != nil {
			return false, errb
		}
	}
}
