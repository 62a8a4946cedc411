// Package pathrestore puts paths of a running guest back as a checkpoint
// holds them: it reads the checkpoint's filesystem mounted on the host
// and writes the guest's through its agent's SFTP server, where a diff
// of the two says they differ.
package pathrestore

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/pkg/sftp"

	"github.com/denhq/den/fsdiff"
)

// What an Action did.
const (
	Restored  = "restored"  // made again from the checkpoint
	Removed   = "removed"   // not in the checkpoint
	Rewritten = "rewritten" // its content put back
	Relinked  = "relinked"  // a symlink's target put back
	Chmod     = "chmod"
	Chown     = "chown"
	Skipped   = "skipped" // not something den puts back (Why says)
)

// Action is one thing done to a guest path.
type Action struct {
	Path string `json:"path"`
	Did  string `json:"did"`
	Why  string `json:"why,omitempty"`
}

// tmpPrefix starts the name of a file being written beside the one it
// replaces.
const tmpPrefix = ".den-restore-"

// Apply makes the guest's paths named by changes (a diff from the
// checkpoint, mounted at root, to the guest's state now) as the
// checkpoint holds them: paths only the guest has are removed, deepest
// first; then, in path order, paths only the checkpoint has are made
// again, and changed ones get their content, target, mode or owner
// back. A file's content is written to a new file beside it and renamed
// over it, so that an inode the guest shares with a path elsewhere
// (a hard link) is left alone. The actions done are returned, also when
// an error stops it midway.
func Apply(ctx context.Context, g *sftp.Client, root string, changes []fsdiff.Change) ([]Action, error) {
	var acts []Action
	remove := slices.Clone(changes)
	slices.SortFunc(remove, func(a, b fsdiff.Change) int { return strings.Compare(b.Path, a.Path) })
	for _, c := range remove {
		retype := c.Op == fsdiff.Changed && slices.Contains(c.What, fsdiff.WhatType)
		if c.Op != fsdiff.Added && !retype {
			continue
		}
		if err := ctx.Err(); err != nil {
			return acts, err
		}
		if err := g.RemoveAll(c.Path); err != nil && !os.IsNotExist(err) {
			return acts, fmt.Errorf("remove %s: %w", c.Path, err)
		}
		if c.Op == fsdiff.Added {
			acts = append(acts, Action{Path: c.Path, Did: Removed})
		}
	}
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return acts, err
		}
		retype := c.Op == fsdiff.Changed && slices.Contains(c.What, fsdiff.WhatType)
		var err error
		switch {
		case c.Op == fsdiff.Removed || retype:
			var did, why string
			did, why, err = create(ctx, g, root, c.Path, c.Old)
			if err == nil {
				acts = append(acts, Action{Path: c.Path, Did: did, Why: why})
			}
		case c.Op == fsdiff.Changed:
			acts, err = update(ctx, g, root, c, acts)
		}
		if err != nil {
			return acts, err
		}
	}
	return acts, nil
}

// create makes p in the guest as f, the checkpoint's inode at root+p.
func create(ctx context.Context, g *sftp.Client, root, p string, f *fsdiff.File) (did, why string, err error) {
	if f == nil {
		return "", "", fmt.Errorf("%s: the diff has no checkpoint side", p)
	}
	switch f.Type {
	case fsdiff.TypeDir:
		if err := g.Mkdir(p); err != nil && !isDir(g, p) {
			return "", "", fmt.Errorf("make directory %s: %w", p, err)
		}
		if err := attrs(g, p, f); err != nil {
			return "", "", err
		}
	case fsdiff.TypeFile:
		if err := write(ctx, g, root, p, f); err != nil {
			return "", "", err
		}
	case fsdiff.TypeSymlink:
		if err := g.Symlink(f.Target, p); err != nil {
			return "", "", fmt.Errorf("symlink %s: %w", p, err)
		}
	default:
		return Skipped, fmt.Sprintf("a %s is not put back", f.Type), nil
	}
	return Restored, "", nil
}

// update puts back what changed about a path present on both sides.
func update(ctx context.Context, g *sftp.Client, root string, c fsdiff.Change, acts []Action) ([]Action, error) {
	f := c.Old
	if f == nil {
		return acts, fmt.Errorf("%s: the diff has no checkpoint side", c.Path)
	}
	content := false
	for _, w := range c.What {
		switch w {
		case fsdiff.WhatContent:
			if f.Type != fsdiff.TypeFile {
				continue
			}
			if err := write(ctx, g, root, c.Path, f); err != nil {
				return acts, err
			}
			content = true
			acts = append(acts, Action{Path: c.Path, Did: Rewritten})
		case fsdiff.WhatTarget:
			if err := g.Remove(c.Path); err != nil && !os.IsNotExist(err) {
				return acts, fmt.Errorf("remove symlink %s: %w", c.Path, err)
			}
			if err := g.Symlink(f.Target, c.Path); err != nil {
				return acts, fmt.Errorf("symlink %s: %w", c.Path, err)
			}
			acts = append(acts, Action{Path: c.Path, Did: Relinked})
		case fsdiff.WhatDevice:
			acts = append(acts, Action{Path: c.Path, Did: Skipped, Why: "a device node is not put back"})
		}
	}
	for _, w := range c.What {
		if content || f.Type == fsdiff.TypeSymlink {
			break // written anew with its mode and owner; a symlink has none of its own
		}
		switch w {
		case fsdiff.WhatMode:
			if err := g.Chmod(c.Path, fileMode(f.Mode)); err != nil {
				return acts, fmt.Errorf("chmod %s: %w", c.Path, err)
			}
			acts = append(acts, Action{Path: c.Path, Did: Chmod})
		case fsdiff.WhatOwner:
			if err := g.Chown(c.Path, int(f.UID), int(f.GID)); err != nil {
				return acts, fmt.Errorf("chown %s: %w", c.Path, err)
			}
			acts = append(acts, Action{Path: c.Path, Did: Chown})
		}
	}
	return acts, nil
}

// write puts the checkpoint's file at root+p in the guest at p: a new
// file beside it, with f's mode, owner and time, renamed over it.
func write(ctx context.Context, g *sftp.Client, root, p string, f *fsdiff.File) error {
	src, err := os.Open(filepath.Join(root, filepath.FromSlash(p)))
	if err != nil {
		return fmt.Errorf("read %s from the checkpoint: %w", p, err)
	}
	defer src.Close()
	tmp := path.Join(path.Dir(p), tmpPrefix+path.Base(p))
	dst, err := g.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	_, err = dst.ReadFrom(ctxReader{ctx, src})
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = attrs(g, tmp, f)
	}
	if err == nil {
		err = g.Chtimes(tmp, f.MTime, f.MTime)
	}
	if err == nil {
		err = g.PosixRename(tmp, p)
	}
	if err != nil {
		_ = g.Remove(tmp)
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// attrs gives p f's owner, then its mode (a chown clears set-id bits).
func attrs(g *sftp.Client, p string, f *fsdiff.File) error {
	if err := g.Chown(p, int(f.UID), int(f.GID)); err != nil {
		return fmt.Errorf("chown %s: %w", p, err)
	}
	if err := g.Chmod(p, fileMode(f.Mode)); err != nil {
		return fmt.Errorf("chmod %s: %w", p, err)
	}
	return nil
}

// fileMode turns a diff's octal permission bits into a FileMode.
func fileMode(octal string) fs.FileMode {
	n, _ := strconv.ParseUint(octal, 8, 32)
	m := fs.FileMode(n & 0o777)
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func isDir(g *sftp.Client, p string) bool {
	fi, err := g.Lstat(p)
	return err == nil && fi.IsDir()
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// Parents makes sure each directory above prefix is one in the guest:
// one the guest lost is made again as the checkpoint (mounted at root)
// holds it; one that is no directory now (a symlink, a file) is refused,
// since writing under it would write elsewhere.
func Parents(g *sftp.Client, root, prefix string) ([]Action, error) {
	var acts []Action
	var above []string
	for d := path.Dir(prefix); d != "/" && d != "."; d = path.Dir(d) {
		above = append(above, d)
	}
	slices.Reverse(above)
	for _, d := range above {
		fi, err := g.Lstat(d)
		if err == nil {
			if !fi.IsDir() {
				return acts, fmt.Errorf("%s in the VM is not a directory (%s): putting %s back would write through it; put %s back first", d, fi.Mode().Type(), prefix, d)
			}
			continue
		}
		if !os.IsNotExist(err) {
			return acts, fmt.Errorf("%s in the VM: %w", d, err)
		}
		hi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(d)))
		if err != nil || !hi.IsDir() {
			return acts, fmt.Errorf("%s is in neither the VM nor the checkpoint as a directory", d)
		}
		st, ok := hi.Sys().(*syscall.Stat_t)
		if !ok {
			return acts, fmt.Errorf("%s in the checkpoint: no owner", d)
		}
		f := &fsdiff.File{Type: fsdiff.TypeDir, Mode: strconv.FormatUint(uint64(st.Mode&0o7777), 8), UID: st.Uid, GID: st.Gid}
		if _, _, err := create(context.Background(), g, root, d, f); err != nil {
			return acts, err
		}
		acts = append(acts, Action{Path: d, Did: Restored})
	}
	return acts, nil
}

// Prefixes makes a set of paths to put back: sorted, each once, none
// under another.
func Prefixes(paths []string) []string {
	out := slices.Clone(paths)
	slices.Sort(out)
	out = slices.Compact(out)
	kept := out[:0]
	for _, p := range out {
		if len(kept) > 0 {
			last := kept[len(kept)-1]
			if p == last || strings.HasPrefix(p, strings.TrimSuffix(last, "/")+"/") {
				continue
			}
		}
		kept = append(kept, p)
	}
	return kept
}
