package fsutil

import (
	"bytes"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

const copyBlock = 1 << 20

// copyRanges copies the data ranges of in (size bytes) to the same offsets
// of out.
func copyRanges(in, out *os.File, size int64) error {
	var off int64
	for off < size {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			// The filesystem cannot tell holes: copy, skipping zeros.
			return copySkippingZeros(in, out, off, size)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		if err := copyRange(in, out, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off, by copy_file_range where possible.
func copyRange(in, out *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			return copySkippingZeros(in, out, off, off+n)
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// copySkippingZeros copies [off, end) block by block, leaving all-zero
// blocks as holes in out.
func copySkippingZeros(in, out *os.File, off, end int64) error {
	buf := make([]byte, copyBlock)
	zero := make([]byte, copyBlock)
	for off < end {
		n := int(min(int64(len(buf)), end-off))
		r, err := in.ReadAt(buf[:n], off)
		if r > 0 && !bytes.Equal(buf[:r], zero[:r]) {
			if _, werr := out.WriteAt(buf[:r], off); werr != nil {
				return werr
			}
		}
		off += int64(r)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}
