// Package sparse copies files by their data ranges, keeping holes: guest
// memory and disks copied in proportion to what the guest used, a
// snapshot's memory written over a clone of the last one where it
// changed.
package sparse

import (
	"fmt"
	"os"
)

// Copy copies src to dst (created or truncated) keeping holes: only
// the data ranges of src are copied (SEEK_DATA/SEEK_HOLE where the
// filesystem answers them, else blocks of zeros are skipped), so a guest
// RAM file whose untouched pages are holes copies in proportion to what the
// guest used, not to its size. dst is fsynced.
func Copy(src, dst string) error {
	_, err := CopyExtents(src, dst)
	return err
}

// CopyExtents is Copy that also returns the data ranges it
// copied: kept beside a copy on a filesystem that cannot tell holes
// (FUSE), they let CopyInto copy it back without reading the holes.
func CopyExtents(src, dst string) ([]Extent, error) {
	return copyFile(src, dst, true)
}

// CopyCache is Copy without the fsync, for a cache: a copy a
// crash may tear, which its user checks or throws away.
func CopyCache(src, dst string) error {
	_, err := copyFile(src, dst, false)
	return err
}

// copyFile is CopyExtents, syncing dst when sync says so.
func copyFile(src, dst string, sync bool) ([]Extent, error) {
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
