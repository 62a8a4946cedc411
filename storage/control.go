package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The JuiceFS client takes requests through a control file at the root of
// its mount: `juicefs clone`, `rmr` and `info` write a request there and
// read the answer back from the same descriptor. den sends its clones
// that way itself: starting the juicefs binary costs about 60 ms of the
// 70 a `juicefs clone` takes here, on every create, checkpoint and
// restore. The format is JuiceFS's (pkg/vfs/internal.go of the release
// den pins, JuiceFSVersion):
//
//	request: op (u32) | body length (u32) | body        (big-endian)
//	clone body: source inode (u64) | source parent inode (u64) |
//	    destination parent inode (u64) | name length (u8) | name |
//	    umask (u16) | mode flags (u8) | threads (u8)
//	answer: progress records (0xFE, then two u64) ... | errno (u8)
const (
	controlName     = ".control"
	controlClone    = 1006 // the clone request
	controlProgress = 0xFE // a progress record: 16 bytes follow
	clonePreserve   = 0x02 // keep the source's owner, mode and times
	cloneThreads    = 4    // the CLI's default, for a directory's entries
)

// errNoControl says the mount has no control file (not a JuiceFS mount of
// a release that takes clones there): the clone falls back to the CLI.
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
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return &fs.PathError{Op: "stat", Path: p, Err: err}
		}
		inos[i] = st.Ino
	}
	body := make([]byte, 0, 3*8+1+len(name)+2+1+1)
	for _, ino := range inos {
		body = binary.BigEndian.AppendUint64(body, ino)
	}
	body = append(body, byte(len(name)))
	body = append(body, name...)
	body = binary.BigEndian.AppendUint16(body, 0o022) // unused with clonePreserve
	body = append(body, clonePreserve, cloneThreads)
	msg := binary.BigEndian.AppendUint32(nil, controlClone)
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(body)))
	msg = append(msg, body...)

	f, err := os.OpenFile(filepath.Join(root, controlName), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return errNoControl
	}
	if err != nil {
		return err
	}
	defer f.Close()
	// One write: the client takes a request whole, and answers at the
	// descriptor's offset after it.
	if _, err := f.Write(msg); err != nil {
		return fmt.Errorf("send clone request: %w", err)
	}
	return readControlAnswer(ctx, f)
}

// readControlAnswer reads the control file until the errno that ends an
// answer, skipping progress records. An empty read means the answer is
// not there yet: it is read again after a wait that grows from 1 ms to
// 16 ms, bounded by ctx.
func readControlAnswer(ctx context.Context, f *os.File) error {
	buf := make([]byte, 64<<10)
	wait := time.Millisecond
	for {
		n, err := f.Read(buf)
		if err != nil && err != io.EOF {
			return fmt.Errorf("read clone answer: %w", err)
		}
		for off := 0; off < n; {
			switch {
			case n-off == 1:
				if errno := syscall.Errno(buf[off]); errno != 0 {
					return fmt.Errorf("juicefs clone: %w", errno)
				}
				return nil
			case buf[off] == controlProgress && n-off >= 17:
				off += 17
			default:
				return fmt.Errorf("read clone answer: unexpected % x", buf[off:n])
			}
		}
		if n > 0 {
			wait = time.Millisecond
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("clone: waiting for juicefs: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 16*time.Millisecond)
	}
}
