// Package fsutil writes files so that a crash leaves either the old or the
// new content, never a torn one.
package fsutil

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFileAtomic writes data to path through a temporary file in the same
// directory: write, fsync, rename, fsync the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// WriteJSONAtomic writes v as indented JSON with WriteFileAtomic.
func WriteJSONAtomic(path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return WriteFileAtomic(path, append(data, '\n'), perm)
}

// SyncDir fsyncs a directory so that a rename or create in it is durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// CopySparse copies src to dst (created or truncated) keeping holes: only
// the data ranges of src are copied (SEEK_DATA/SEEK_HOLE where the
// filesystem answers them, else blocks of zeros are skipped), so a guest
// RAM file whose untouched pages are holes copies in proportion to what the
// guest used, not to its size. dst is fsynced.
func CopySparse(src, dst string) error {
	_, err := CopySparseExtents(src, dst)
	return err
}

// CopySparseExtents is CopySparse that also returns the data ranges it
// copied: kept beside a copy on a filesystem that cannot tell holes
// (FUSE), they let CopyExtents copy it back without reading the holes.
func CopySparseExtents(src, dst string) ([]Extent, error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", src, err)
	}
	var ext []Extent
	err = writeSynced(dst, st.Size(), st.Mode().Perm(), func(out *os.File) error {
		ext, err = copyRanges(in, out, st.Size())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return ext, nil
}

// CopyExtents copies only the given data ranges of src into dst (created
// or truncated to size); the rest of dst is holes. dst is fsynced.
func CopyExtents(src, dst string, size int64, ext []Extent) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	err = writeSynced(dst, size, 0o600, func(out *os.File) error {
		for _, e := range ext {
			if e.Off < 0 || e.Len < 0 || e.Off+e.Len > size {
				return fmt.Errorf("extent %d+%d outside a file of %d bytes", e.Off, e.Len, size)
			}
			if err := copyRange(in, out, e.Off, e.Len); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// writeSynced creates dst, lets fill write it, sets its size and fsyncs.
func writeSynced(dst string, size int64, perm os.FileMode, fill func(*os.File) error) error {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if err := fill(out); err != nil {
		out.Close()
		return err
	}
	if err := out.Truncate(size); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// SyncTree flushes every regular file and directory under dir to stable
// storage.
func SyncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", p, err)
		}
		return nil
	})
}
