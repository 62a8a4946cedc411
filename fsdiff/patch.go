package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// links names, for each added path, the other path of its inode when
// it is a new hard link, and the removed path it was when it is a
// rename (the same inode, of the same generation, at a removed path).
func (d *differ) links(a, b tree) error {
	removed := map[uint64]string{}
	for _, c := range d.res.Changes {
		if c.Op == Removed {
			removed[a[c.Path].ino] = c.Path
		}
	}
	byIno := map[uint64][]string{} // b's paths of inodes with several links
	for p, e := range b {
		if e.Type != TypeDir && e.Links > 1 {
			byIno[e.ino] = append(byIno[e.ino], p)
		}
	}
	for i := range d.res.Changes {
		c := &d.res.Changes[i]
		if c.Op != Added {
			continue
		}
		n := b[c.Path]
		if n.Type != TypeDir && n.Links > 1 {
			c.LinkOf = otherLink(byIno[n.ino], c.Path, a)
		}
		if from, ok := removed[n.ino]; ok && a[from].Type == n.Type {
			same, err := sameInode(a[from], n)
			if err != nil {
				return err
			}
			if same {
				c.MovedFrom = from
			}
		}
	}
	return nil
}

// otherLink picks, among an inode's paths, one other than p, preferring
// one that was there before.
func otherLink(paths []string, p string, before tree) string {
	best := ""
	for _, q := range paths {
		if q == p {
			continue
		}
		_, old := before[q]
		_, bestOld := before[best]
		if best == "" || old && !bestOld || old == bestOld && q < best {
			best = q
		}
	}
	return best
}

// sameInode says whether two entries with one inode number are one
// inode: of the same generation where it can be read (files and
// directories), of the same target for a symlink.
func sameInode(o, n *entry) (bool, error) {
	switch o.Type {
	case TypeFile, TypeDir:
		og, err := generation(o.fsys)
		if err != nil {
			return false, err
		}
		ng, err := generation(n.fsys)
		if err != nil {
			return false, err
		}
		return og == ng, nil
	case TypeSymlink:
		return o.Target == n.Target, nil
	}
	return true, nil
}

// patchTimeout bounds one diff(1) run.
const patchTimeout = 30 * time.Second

// patch fills in a regular file's unified diff, or says why there is
// none (binary content, too large).
func (d *differ) patch(c *Change, a, b tree) error {
	oldPath, newPath := "/dev/null", "/dev/null"
	oldLabel, newLabel := "/dev/null", "/dev/null"
	switch {
	case c.Op == Added && c.New.Type == TypeFile:
		newPath, newLabel = b[c.Path].fsys, "b"+c.Path
	case c.Op == Removed && c.Old.Type == TypeFile:
		oldPath, oldLabel = a[c.Path].fsys, "a"+c.Path
	case c.Op == Changed && c.Old.Type == TypeFile && c.New.Type == TypeFile && has(c.What, WhatContent):
		oldPath, oldLabel = a[c.Path].fsys, "a"+c.Path
		newPath, newLabel = b[c.Path].fsys, "b"+c.Path
	default:
		return nil
	}
	for _, p := range []string{oldPath, newPath} {
		bin, err := isBinary(p)
		if err != nil {
			return err
		}
		if bin {
			c.Binary = true
			return nil
		}
	}
	for _, f := range []*File{c.Old, c.New} {
		if f != nil && f.Type == TypeFile && f.Size > patchFileMax {
			c.NoPatch = fmt.Sprintf("larger than %d KiB", patchFileMax>>10)
			return nil
		}
	}
	if d.patchBytes >= patchTotalMax {
		c.NoPatch = fmt.Sprintf("patches past %d MiB left out", patchTotalMax>>20)
		return nil
	}
	ctx, cancel := context.WithTimeout(d.ctx, patchTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "diff", "-u", "--label", oldLabel, "--label", newLabel, oldPath, newPath)
	cmd.WaitDelay = time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return fmt.Errorf("diff %s: %w: %s", c.Path, err, strings.TrimSpace(stderr.String()))
	}
	c.Patch = string(out)
	d.patchBytes += len(out)
	return nil
}

// isBinary says whether a file's first 8000 bytes hold a NUL (as git
// decides).
func isBinary(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 8000)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return false, err
	}
	return bytes.IndexByte(buf[:n], 0) >= 0, nil
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
