//go:build linux

package procrec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/agent"
)

// DefaultFilePaths are where files written are recorded by default.
var DefaultFilePaths = []string{"/root", "/home", "/etc", "/srv"}

// scratchDirs are where programs write files of the moment (a compiler's
// assembly, for one): their files are not recorded, and an ignore mark
// on each has the kernel drop those events before they reach the agent.
// A scratch directory under a watched path is watched.
var scratchDirs = []string{"/tmp", "/var/tmp"}

// coalesce merges a file written again by the same process within it
// into the newest event (a log appended to line by line).
const coalesce = 2 * time.Second

// fanotify_event_metadata: event_len u32, vers u8, reserved u8,
// metadata_len u16, mask u64, fd s32, pid s32.
const fanMetaLen = 24

// WatchFiles records the files closed after a write under paths (the
// file, the process, its size then), from the kernel's fanotify: one
// mark on each file system the paths are on. Paths that do not exist
// are skipped.
func (r *Recorder) WatchFiles(paths []string) error {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_LARGEFILE|unix.O_CLOEXEC)
	if err != nil {
		return fmt.Errorf("file record: fanotify: %w", err)
	}
	w := &fanWatch{fd: fd}
	seen := map[uint64]bool{}
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			continue
		}
		w.prefixes = append(w.prefixes, strings.TrimSuffix(p, "/")+"/")
		if !seen[st.Dev] {
			seen[st.Dev] = true
			w.marks = append(w.marks, p)
		}
	}
	if len(w.prefixes) == 0 {
		unix.Close(fd)
		return errors.New("file record: none of the paths exists")
	}
	for _, d := range scratchDirs {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil && seen[st.Dev] && !under(d+"/", w.prefixes) {
			w.ignores = append(w.ignores, d)
		}
	}
	if err := w.mark(true); err != nil {
		unix.Close(fd)
		return err
	}
	r.sw.Lock()
	defer r.sw.Unlock()
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.fan = w
	}
	r.mu.Unlock()
	if closed {
		unix.Close(fd)
		return errors.New("file record: the process record is closed")
	}
	r.kick() // run polls the group from now on
	return nil
}

// fanWatch is the file record's fanotify group: one mark on the file
// system of each of marks.
type fanWatch struct {
	fd       int
	marks    []string
	prefixes []string
	ignores  []string     // scratch directories whose files' events are dropped
	outside  atomic.Int64 // events read for files outside prefixes
	failed   bool         // a read failed (run's): logged once
}

// mark adds the marks, or removes them.
func (w *fanWatch) mark(on bool) error {
	op := uint(unix.FAN_MARK_ADD)
	if !on {
		op = unix.FAN_MARK_REMOVE
	}
	for _, p := range w.marks {
		if err := unix.FanotifyMark(w.fd, op|unix.FAN_MARK_FILESYSTEM, unix.FAN_CLOSE_WRITE, unix.AT_FDCWD, p); err != nil {
			return fmt.Errorf("file record: mark the file system of %s: %w", p, err)
		}
	}
	for _, d := range w.ignores {
		// Linux 6.0 and later; an older kernel hands the events on and
		// file drops them.
		_ = unix.FanotifyMark(w.fd, op|unix.FAN_MARK_IGNORE_SURV, unix.FAN_CLOSE_WRITE|unix.FAN_EVENT_ON_CHILD, unix.AT_FDCWD, d)
	}
	return nil
}

// under says whether path lies under one of prefixes (each ending in /).
func under(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// readFiles takes the fanotify events waiting off the queue, unhandled
// (each holds an open fd until handleFiles closes it). Only run calls
// it. An error is logged, once, and leaves the rest for the next batch.
func (r *Recorder) readFiles(w *fanWatch, buf []byte) [][]byte {
	var out [][]byte
	for range batchMax / 64 {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) || err == nil && n <= 0 {
			break
		}
		if err != nil {
			if !w.failed {
				w.failed = true
				r.log.Warn("file record: read", "err", err)
			}
			break
		}
		out = append(out, bytes.Clone(buf[:n]))
	}
	return out
}

// handleFiles records the fanotify events of b and closes their fds.
func (r *Recorder) handleFiles(w *fanWatch, b []byte) {
	self := os.Getpid()
	le := binary.LittleEndian
	for len(b) >= fanMetaLen {
		l := int(le.Uint32(b[0:]))
		if l < fanMetaLen || l > len(b) {
			break
		}
		efd, pid := int(int32(le.Uint32(b[16:]))), int(int32(le.Uint32(b[20:])))
		b = b[l:]
		if efd < 0 {
			continue // the queue overflowed
		}
		if !r.file(efd, pid, self, w.prefixes) {
			w.outside.Add(1)
		}
		unix.Close(efd)
	}
}

// file records one file closed after a write, when it is under one of
// prefixes; outside them it says false.
func (r *Recorder) file(fd, pid, self int, prefixes []string) bool {
	path, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return true
	}
	if !under(path, prefixes) {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return true
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.paused {
		return true // queued before the marks went
	}
	// Merged into a recent event of the same process and file (other
	// processes' events may lie between), only one den has not read.
	for i, n := 0, len(r.events); i < patchBack && i < n; i++ {
		last := &r.events[(r.next-1-i+2*n)%n]
		if last.Seq <= r.read || now.Sub(last.Time) >= coalesce {
			break
		}
		if last.Kind == agent.ProcFile && last.PID == pid && last.Path == path {
			last.Bytes = st.Size
			last.Writes++
			return true
		}
	}
	ev := agent.ProcEvent{Time: now, Kind: agent.ProcFile, PID: pid, UID: -1, Path: path, Bytes: st.Size, Writes: 1}
	if p := r.live[pid]; p != nil {
		ev.PPID, ev.UID = p.ppid, p.uid
	} else if g, ok := r.gone[pid]; ok {
		ev.PPID, ev.UID = g.ppid, g.uid
	}
	if pid == self {
		ev.Session = "den-agent" // sftp, den cp, E2B files: written by the agent for a session
	} else {
		ev.Session = r.sessionOf(pid)
	}
	r.add(ev)
	return true
}
