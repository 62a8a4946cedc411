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

// ReplaceFile writes data to path through a temporary file in the same
// directory and a rename, without syncing: readers see the old file or
// the new one, never a part. For a caller that writes several files and
// then syncs their filesystem once (durable only after that sync).
func ReplaceFile(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, path)
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteJSONAtomic writes v as indented JSON with WriteFileAtomic.
func WriteJSONAtomic(path string, v any, perm os.FileMode) error {
	return writeJSON(WriteFileAtomic, path, v, perm)
}

// ReplaceJSON writes v as indented JSON with ReplaceFile: not synced.
func ReplaceJSON(path string, v any, perm os.FileMode) error {
	return writeJSON(ReplaceFile, path, v, perm)
}

func writeJSON(write func(string, []byte, os.FileMode) error, path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return write(path, append(data, '\n'), perm)
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
// (FUSE), they let CopyInto copy it back without reading the holes.
func CopySparseExtents(src, dst string) ([]Extent, error) {
	return copySparse(src, dst, true)
}

// CopySparseCache is CopySparse without the fsync, for a cache: a copy a
// crash may tear, which its user checks or throws away.
func CopySparseCache(src, dst string) error {
	_, err := copySparse(src, dst, false)
	return err
}

// copySparse is CopySparseExtents, syncing dst when sync says so.
func copySparse(src, dst string, sync bool) ([]Extent, error) {
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
	err = writeFile(dst, st.Size(), st.Mode().Perm(), sync, func(out *os.File) error {
		ext, err = copyRanges(in, out, st.Size())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return ext, nil
}

// CopyInto copies data ranges of src into the same offsets of dst, an
// existing file as large as src whose other bytes are zeros (holes): the
// ranges ext lists, or, when ext is nil, every data range of src. dst is
// written in place, never truncated nor replaced (another process may
// have it mapped), and not synced: it is a guest's RAM file on a memory
// filesystem.
func CopyInto(src, dst string, ext []Extent) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	err = func() error {
		ist, err := in.Stat()
		if err != nil {
			return err
		}
		ost, err := out.Stat()
		if err != nil {
			return err
		}
		if ist.Size() != ost.Size() {
			return fmt.Errorf("%s is %d bytes, %s %d", src, ist.Size(), dst, ost.Size())
		}
		if ext == nil {
			_, err := copyRanges(in, out, ist.Size())
			return err
		}
		for _, e := range ext {
			if e.Off < 0 || e.Len < 0 || e.Off+e.Len > ist.Size() {
				return fmt.Errorf("extent %d+%d outside a file of %d bytes", e.Off, e.Len, ist.Size())
			}
			if err := copyRange(in, out, e.Off, e.Len); err != nil {
				return err
			}
		}
		return nil
	}()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// writeFile creates dst, lets fill write it, sets its size and, when
// sync says so, fsyncs it.
func writeFile(dst string, size int64, perm os.FileMode, sync bool, fill func(*os.File) error) error {
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
	if sync {
		if err := out.Sync(); err != nil {
			out.Close()
			return err
		}
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
