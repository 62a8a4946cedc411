package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/internal/fsutil"
	"golang.org/x/sys/unix"
)

// Dir is a Volume on a plain local directory, for tests of other packages
// and hosts without FUSE. Clone uses a reflink (FICLONE) where the file
// system has them, else a sparse copy: correct, but not O(metadata).
type Dir struct {
	root string
}

var _ Volume = (*Dir)(nil)

// NewDir makes root (if needed) and returns a Volume on it.
func NewDir(root string) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("open dir volume %s: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("open dir volume %s: %w", root, err)
	}
	return &Dir{root: abs}, nil
}

// Root is the directory.
func (d *Dir) Root() string { return d.root }

// Path maps p under the directory.
func (d *Dir) Path(p Path) (string, error) { return hostPath(d.root, p) }

// MkdirAll creates directory p and its parents.
func (d *Dir) MkdirAll(ctx context.Context, p Path) error {
	hp, err := d.Path(p)
	if err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	if err := os.MkdirAll(hp, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

// CreateDisk creates a sparse file of size bytes.
func (d *Dir) CreateDisk(ctx context.Context, p Path, size int64) error {
	hp, err := d.Path(p)
	if err != nil {
		return fmt.Errorf("create disk %s: %w", p, err)
	}
	return createSparse(hp, p, size)
}

// Clone copies src to dst (reflink or sparse copy), atomically.
func (d *Dir) Clone(ctx context.Context, src, dst Path) error {
	if err := d.clone(src, dst, false); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}

// CloneOver copies file src over file dst, atomically.
func (d *Dir) CloneOver(ctx context.Context, src, dst Path) error {
	if err := d.clone(src, dst, true); err != nil {
		return fmt.Errorf("clone %s over %s: %w", src, dst, err)
	}
	return nil
}

func (d *Dir) clone(src, dst Path, replace bool) error {
	hs, err := d.Path(src)
	if err != nil {
		return err
	}
	hd, err := d.Path(dst)
	if err != nil {
		return err
	}
	if strings.HasPrefix(string(dst)+"/", string(src)+"/") {
		return errors.New("destination inside source")
	}
	st, err := os.Stat(hs)
	if err != nil {
		return err
	}
	if replace && st.IsDir() {
		return errors.New("source is a directory: CloneOver takes files")
	}
	if _, err := os.Lstat(hd); err == nil && !replace {
		return fmt.Errorf("destination: %w", fs.ErrExist)
	}
	if err := os.MkdirAll(filepath.Dir(hd), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(hd), fmt.Sprintf(".%s.clone-%d", filepath.Base(hd), time.Now().UnixNano()))
	err = filepath.WalkDir(hs, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(hs, p)
		out := filepath.Join(tmp, rel)
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			return os.Mkdir(out, info.Mode().Perm())
		case e.Type().IsRegular():
			return copyFile(p, out, info.Mode().Perm())
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
	})
	if err == nil {
		if replace {
			err = os.Rename(tmp, hd)
		} else {
			err = renameNoReplace(tmp, hd)
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return fsutil.SyncDir(filepath.Dir(hd))
}

// copyFile reflinks src to dst, or copies it sparsely.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		if err := out.Sync(); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	out.Close()
	return fsutil.CopySparse(src, dst)
}

// Rename moves from to to atomically.
func (d *Dir) Rename(ctx context.Context, from, to Path) error {
	hf, err := d.Path(from)
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	ht, err := d.Path(to)
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	return renamePaths(hf, ht, from, to)
}

// Remove removes p and everything under it.
func (d *Dir) Remove(ctx context.Context, p Path) error {
	hp, err := d.Path(p)
	if err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	if err := os.RemoveAll(hp); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Usage sums lengths and allocated blocks.
func (d *Dir) Usage(ctx context.Context, p Path) (Usage, error) {
	hp, err := d.Path(p)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s: %w", p, err)
	}
	var u Usage
	err = filepath.WalkDir(hp, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return err
		}
		u.Files++
		u.Logical += st.Size
		u.Data += st.Blocks * 512
		return nil
	})
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s: %w", p, err)
	}
	return u, nil
}

// Health checks that the directory is there.
func (d *Dir) Health(ctx context.Context) error {
	if _, err := os.Stat(d.root); err != nil {
		return fmt.Errorf("dir volume: %w", err)
	}
	return nil
}

// Subscribe returns a channel that gets no events: a directory has no mount
// to lose.
func (d *Dir) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event)
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
}

// Close does nothing.
func (d *Dir) Close() error { return nil }
