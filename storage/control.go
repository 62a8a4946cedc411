package storage

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/sparse"
)

// The JuiceFS client takes requests through a control file at the root of
// its mount: `juicefs clone` and `info` write a request there and read
// the answer back from the same descriptor. den sends its requests that
// way itself: starting the juicefs binary costs about 60 ms of the 70 a
// `juicefs clone` takes here, on every create, checkpoint and restore,
// and two more for a checkpoint's sizes. The format is JuiceFS's
// (pkg/vfs/internal.go of the release den pins, JuiceFSVersion):
//
//	request: op (u32) | body length (u32) | body        (big-endian)
//	clone body: source inode (u64) | source parent inode (u64) |
//	    destination parent inode (u64) | name length (u8) | name |
//	    umask (u16) | mode flags (u8) | threads (u8)
//	info body: inode (u64) | recursive (u8) | raw (u8) | strict (u8)
//	answer: progress records (0xFE, then two u64) ..., then an errno
//	    (u8), or 0xFF, a length (u32) and that much JSON
const (
	controlName     = ".control"
	controlInfo     = 1005 // InfoV2: a JSON summary of an inode
	controlClone    = 1006 // the clone request
	controlProgress = 0xFE // a progress record: 16 bytes follow
	controlData     = 0xFF // a data answer: a length and the data follow
	clonePreserve   = 0x02 // keep the source's owner, mode and times
	cloneThreads    = 4    // the CLI's default, for a directory's entries
)

// errNoControl says the mount has no control file (not a JuiceFS mount of
// a release that takes requests there): the caller runs the CLI instead.
var errNoControl = errors.New("no juicefs control file")

// ControlClone clones host path src to dst, which must not exist, as
// `juicefs clone --preserve` does, through the control file of the JuiceFS
// mount at root. ctx bounds the wait for the answer; a clone given up on
// may still finish (the caller removes dst). Volume.Clone is what den
// uses; this is for tools timing the step alone (den bench).
func ControlClone(ctx context.Context, root, src, dst string) error {
	name := filepath.Base(dst)
	if len(name) > 255 {
		return fmt.Errorf("clone name %q: too long", name)
	}
	var inos [3]uint64
	for i, p := range []string{src, filepath.Dir(src), filepath.Dir(dst)} {
		ino, err := inode(p)
		if err != nil {
			return err
		}
		inos[i] = ino
	}
	body := make([]byte, 0, 3*8+1+len(name)+2+1+1)
	for _, ino := range inos {
		body = binary.BigEndian.AppendUint64(body, ino)
	}
	body = append(body, byte(len(name)))
	body = append(body, name...)
	body = binary.BigEndian.AppendUint16(body, 0o022) // unused with clonePreserve
	body = append(body, clonePreserve, cloneThreads)
	if _, err := control(ctx, root, controlClone, body); err != nil {
		return fmt.Errorf("juicefs clone: %w", err)
	}
	return nil
}

// sliceInfo is what den reads of an info answer: a file's slices (raw),
// chunk by chunk in order, each chunk's from its start: the slices of
// JuiceFS's built view, where a hole is a slice of id 0 (and a chunk with
// no slice at all is a hole).
type sliceInfo struct {
	Failed bool
	Reason string
	Chunks []struct {
		Chunk uint64 `json:"ChunkIndex"`
		ID    uint64 `json:"Id"`
		Len   uint32
	}
}

// chunkSize is JuiceFS's chunk: a file's slices are listed per chunk.
const chunkSize = 64 << 20

// controlSlices asks the mount at root for the slices of file (a host
// path under it).
func controlSlices(ctx context.Context, root, file string) (sliceInfo, error) {
	ino, err := inode(file)
	if err != nil {
		return sliceInfo{}, err
	}
	body := binary.BigEndian.AppendUint64(nil, ino)
	body = append(body, 0, 1, 0) // not recursive, raw slices, not strict
	data, err := control(ctx, root, controlInfo, body)
	if err != nil {
		return sliceInfo{}, fmt.Errorf("juicefs info: %w", err)
	}
	var info sliceInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return sliceInfo{}, fmt.Errorf("juicefs info: %w", err)
	}
	if info.Failed {
		return sliceInfo{}, fmt.Errorf("juicefs info: %s", info.Reason)
	}
	return info, nil
}

// dataRanges is where info's slices hold data, in order, adjacent ones
// merged.
func (info sliceInfo) dataRanges() []sparse.Extent {
	var out []sparse.Extent
	var pos int64
	chunk := ^uint64(0)
	for _, c := range info.Chunks {
		if c.Chunk != chunk {
			chunk, pos = c.Chunk, 0
		}
		off := int64(chunk)*chunkSize + pos
		pos += int64(c.Len)
		if c.ID != 0 && c.Len != 0 {
			out = sparse.AddExtent(out, off, int64(c.Len))
		}
	}
	return out
}

// controlDataBytes is the data a file's slices reference (holes are no
// slices; a slice of id 0 is a hole written as zeroes), asked through the
// control file of the mount at root.
func controlDataBytes(ctx context.Context, root, file string) (int64, error) {
	info, err := controlSlices(ctx, root, file)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range info.dataRanges() {
		n += e.Len
	}
	return n, nil
}

func inode(p string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return 0, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	return st.Ino, nil
}

// control sends one request to the control file of the mount at root and
// returns the data of its answer (nil for an answer that is an errno 0).
func control(ctx context.Context, root string, op uint32, body []byte) ([]byte, error) {
	msg := binary.BigEndian.AppendUint32(nil, op)
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(body)))
	msg = append(msg, body...)
	// A fork copies every descriptor, and the copy's close (at exec, or
	// at the child's exit) flushes the control file, which makes JuiceFS
	// cancel the request in flight: the clone ends in EINTR. So this
	// process forks no child while the descriptor is open: Go's fork
	// waits for ForkLock's readers (a clone takes 5-20 ms; ctx bounds the
	// wait). The deferred Close runs before the unlock.
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	f, err := os.OpenFile(filepath.Join(root, controlName), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoControl
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// One write: the client takes a request whole, and answers at the
	// descriptor's offset after it.
	if _, err := f.Write(msg); err != nil {
		return nil, fmt.Errorf("send request: %w", err)
	}
	return readAnswer(ctx, f)
}

// readAnswer reads the control file until an answer's end, skipping
// progress records. An empty read means the answer is not there yet: it
// is read again after a wait that grows from 1 ms to 16 ms, bounded by
// ctx.
func readAnswer(ctx context.Context, f *os.File) ([]byte, error) {
	buf := make([]byte, 64<<10)
	wait := time.Millisecond
	for {
		n, err := f.Read(buf)
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("read answer: %w", err)
		}
		for off := 0; off < n; {
			switch {
			case n-off == 1:
				if errno := syscall.Errno(buf[off]); errno != 0 {
					return nil, errno
				}
				return nil, nil
			case buf[off] == controlProgress && n-off >= 17:
				off += 17
			case buf[off] == controlData && n-off >= 5:
				size := int(binary.BigEndian.Uint32(buf[off+1:]))
				data := append([]byte(nil), buf[off+5:n]...)
				return readRest(ctx, f, data, size)
			default:
				return nil, fmt.Errorf("read answer: unexpected % x", buf[off:min(n, off+32)])
			}
		}
		if n > 0 {
			wait = time.Millisecond
			continue
		}
		if err := pause(ctx, wait); err != nil {
			return nil, err
		}
		wait = min(2*wait, 16*time.Millisecond)
	}
}

// readRest reads a data answer's rest, until it has size bytes.
func readRest(ctx context.Context, f *os.File, data []byte, size int) ([]byte, error) {
	buf := make([]byte, 64<<10)
	for len(data) < size {
		n, err := f.Read(buf)
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("read answer: %w", err)
		}
		data = append(data, buf[:n]...)
		if n == 0 {
			if err := pause(ctx, time.Millisecond); err != nil {
				return nil, err
			}
		}
	}
	if len(data) > size {
		return nil, fmt.Errorf("read answer: %d bytes after its data", len(data)-size)
	}
	return data, nil
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("waiting for juicefs: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}
