package sparse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

const copyBlock = 1 << 20

// Extent is a range of data in a sparse file.
type Extent struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// AddExtent appends a range, merging it with the last one when adjacent.
func AddExtent(ext []Extent, off, n int64) []Extent {
	if k := len(ext); k > 0 && ext[k-1].Off+ext[k-1].Len == off {
		ext[k-1].Len += n
		return ext
	}
	return append(ext, Extent{off, n})
}

// copyRanges copies the data ranges of in (size bytes) to the same offsets
// of out and returns them.
func copyRanges(in, out *os.File, size int64) ([]Extent, error) {
	ext, ok := dataRanges(in, size)
	if !ok {
		// The filesystem cannot tell holes: copy, skipping zeros.
		return copySkippingZeros(in, out, 0, size)
	}
	for _, e := range ext {
		if err := copyRange(in, out, e.Off, e.Len); err != nil {
			return nil, err
		}
	}
	return ext, nil
}

// copyRange copies n bytes at off, by copy_file_range where possible.
func copyRange(in, out *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			if onTmpfs(out) {
				return sendRange(in, out, off, n)
			}
			_, err := copySkippingZeros(in, out, off, off+n)
			return err
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// sendRange copies n bytes at off by sendfile, which copies in the kernel
// between filesystems, where copy_file_range refuses (EXDEV): into a
// tmpfs it is faster than reading, comparing and writing, though it
// writes the all-zero blocks that the block copy leaves as holes; into a
// FUSE mount it is slower (the kernel writes 64 KiB at a time), so
// copyRange uses it for a tmpfs only (docs/benchmarks.md, "Constants set
// from measurements"). What sendfile cannot copy is copied block by
// block.
func sendRange(in, out *os.File, off, n int64) error {
	if _, err := out.Seek(off, io.SeekStart); err == nil {
		for n > 0 {
			roff := off
			c, err := unix.Sendfile(int(out.Fd()), int(in.Fd()), &roff, int(min(n, 1<<30)))
			if err != nil || c <= 0 {
				break
			}
			off += int64(c)
			n -= int64(c)
		}
	}
	if n == 0 {
		return nil
	}
	_, err := copySkippingZeros(in, out, off, off+n)
	return err
}

// onTmpfs says whether f is on a tmpfs.
func onTmpfs(f *os.File) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(int(f.Fd()), &st) == nil && st.Type == unix.TMPFS_MAGIC
}

// copySkippingZeros copies [off, end) block by block, leaving all-zero
// blocks as holes in out, and returns the blocks it wrote.
func copySkippingZeros(in, out *os.File, off, end int64) ([]Extent, error) {
	buf := make([]byte, copyBlock)
	zero := make([]byte, copyBlock)
	var ext []Extent
	for off < end {
		n := int(min(int64(len(buf)), end-off))
		r, err := in.ReadAt(buf[:n], off)
		if r > 0 && !bytes.Equal(buf[:r], zero[:r]) {
			if _, werr := out.WriteAt(buf[:r], off); werr != nil {
				return nil, werr
			}
			ext = AddExtent(ext, off, int64(r))
		}
		off += int64(r)
		if err == io.EOF {
			return ext, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return ext, nil
}

// pageSize is the unit CopyDelta compares: a guest page.
const pageSize = 4096

// DeltaGap is the largest run of unchanged bytes CopyDelta writes again
// to join two runs of changed pages into one write: through JuiceFS each
// write far from the last is a slice and an object of its own, which
// costs more than rewriting a MiB beside it. 1 MiB was the fastest of the
// gaps measured (docs/benchmarks.md, "Constants set from measurements").
var DeltaGap int64 = 1 << 20

// CopyDelta makes dst hold what src holds, where dst, a file of src's
// size, already holds what base holds (a metadata clone of an earlier
// copy of src, of which base is another copy, on a filesystem that reads
// cheaper): it compares src with base page by page over the data ranges
// of either, and writes to dst only the runs of pages that differ (zeros
// where src has a hole and base had data), joined when DeltaGap or less
// apart. A guest's memory changes little between two snapshots, and the
// write is what costs through a FUSE volume (some 200 MB/s here). dst is
// fsynced. It returns the data ranges of src, as CopyExtents does,
// and how many bytes it wrote.
func CopyDelta(src, dst, base string) ([]Extent, int64, error) {
	fail := func(err error) ([]Extent, int64, error) {
		return nil, 0, fmt.Errorf("copy changes of %s to %s: %w", src, dst, err)
	}
	in, err := os.Open(src)
	if err != nil {
		return fail(err)
	}
	defer in.Close()
	old, err := os.Open(base)
	if err != nil {
		return fail(err)
	}
	defer old.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	st, err := in.Stat()
	if err != nil {
		return fail(err)
	}
	size := st.Size()
	for _, f := range []*os.File{old, out} {
		if st, err := f.Stat(); err != nil || st.Size() != size {
			return fail(fmt.Errorf("%s is not %s's %d bytes (%v)", f.Name(), src, size, err))
		}
	}
	ext, _ := dataRanges(in, size)
	oldExt, _ := dataRanges(old, size)
	var changed []Extent
	a, b := make([]byte, copyBlock), make([]byte, copyBlock)
	for _, r := range unionPages(ext, oldExt, size) {
		for off := r.Off; off < r.Off+r.Len; {
			n := int(min(int64(copyBlock), r.Off+r.Len-off))
			if err := readFull(in, a[:n], off); err != nil {
				return fail(err)
			}
			if err := readFull(old, b[:n], off); err != nil {
				return fail(err)
			}
			changed = changedPages(changed, a[:n], b[:n], off)
			off += int64(n)
		}
	}
	var written int64
	for _, c := range changed {
		for off := c.Off; off < c.Off+c.Len; {
			n := int(min(int64(copyBlock), c.Off+c.Len-off))
			if err := readFull(in, a[:n], off); err != nil {
				return fail(err)
			}
			if _, err := out.WriteAt(a[:n], off); err != nil {
				return fail(err)
			}
			written += int64(n)
			off += int64(n)
		}
	}
	if err := out.Sync(); err != nil {
		return fail(err)
	}
	if err := out.Close(); err != nil {
		return fail(err)
	}
	return ext, written, nil
}

// changedPages adds to runs the pages of cur that differ from old (both
// as long, at off in their files), joining a page to the last run when
// DeltaGap or less after it.
func changedPages(runs []Extent, cur, old []byte, off int64) []Extent {
	if bytes.Equal(cur, old) {
		return runs
	}
	for p := 0; p < len(cur); p += pageSize {
		e := min(p+pageSize, len(cur))
		if bytes.Equal(cur[p:e], old[p:e]) {
			continue
		}
		at, n := off+int64(p), int64(e-p)
		if k := len(runs); k > 0 && at-(runs[k-1].Off+runs[k-1].Len) <= DeltaGap {
			runs[k-1].Len = at + n - runs[k-1].Off
			continue
		}
		runs = append(runs, Extent{at, n})
	}
	return runs
}

// readFull reads len(buf) bytes at off: what lies past the end reads as
// zeros.
func readFull(f *os.File, buf []byte, off int64) error {
	n, err := f.ReadAt(buf, off)
	if err == io.EOF {
		clear(buf[n:])
		return nil
	}
	return err
}

// DataRanges lists the data ranges of the file at path, in order, as its
// filesystem tells them (SEEK_DATA and SEEK_HOLE); ok is false, with the
// whole file as one range, when the filesystem cannot tell holes.
func DataRanges(path string) (ext []Extent, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	ext, ok = dataRanges(f, st.Size())
	return ext, ok, nil
}

// dataRanges lists the data ranges of f (size bytes); ok is false, with
// the whole file as one range, when its filesystem cannot tell holes.
func dataRanges(f *os.File, size int64) (ext []Extent, ok bool) {
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return []Extent{{0, size}}, false
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil || hole > size {
			hole = size
		}
		ext = AddExtent(ext, data, hole-data)
		off = hole
	}
	return ext, true
}

// unionPages merges two sorted lists of ranges into one, each range
// widened to whole pages (and cut at size).
func unionPages(a, b []Extent, size int64) []Extent {
	all := make([]Extent, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		var e Extent
		if len(b) == 0 || len(a) > 0 && a[0].Off <= b[0].Off {
			e, a = a[0], a[1:]
		} else {
			e, b = b[0], b[1:]
		}
		start := e.Off / pageSize * pageSize
		end := min((e.Off+e.Len+pageSize-1)/pageSize*pageSize, size)
		if k := len(all); k > 0 && start <= all[k-1].Off+all[k-1].Len {
			all[k-1].Len = max(all[k-1].Len, end-all[k-1].Off)
			continue
		}
		all = append(all, Extent{start, end - start})
	}
	return all
}
