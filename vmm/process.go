package vmm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/atomicfile"
)

// ProcessSpec says how to start a VMM process.
type ProcessSpec struct {
	// Binary is the VMM executable.
	Binary string
	// Args are its arguments (without the binary).
	Args []string
	// Env is added to a minimal environment (PATH only).
	Env []string
	// Log receives the process's stdout and stderr (appended).
	Log string
	// PIDFile records the process so a later caller can adopt it.
	PIDFile string
	// Dir is the working directory.
	Dir string
	// Confine is the user and control group the process runs as and
	// in, from its start.
	Confine Confine
	// ExtraFiles are inherited as fds 3, 4, ... (disks or snapshot
	// files the daemon opened for a VMM that may not open them itself).
	ExtraFiles []*os.File
}

// Process is a supervised VMM process: started in its own session so that
// neither the caller's context nor the caller's death stops it, with its
// exit noticed at once, by wait for a child or by pidfd for an adopted one.
//
// Signals go through a pidfd, never a pid that may have been reused: Go's
// os.Process holds one for a child, and an adopted process keeps the one
// it was opened with until it exits.
type Process struct {
	pid  int
	done chan struct{}

	mu    sync.Mutex
	err   error
	os    *os.Process // a child
	pidfd int         // an adopted process, -1 once it exited
}

// pidRecord is the PID file's content; StartTime guards against a reused PID.
type pidRecord struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Binary    string `json:"binary"`
}

// StartProcess starts spec's binary in a new session with stdout and
// stderr appended to spec.Log, and records it in spec.PIDFile.
func StartProcess(spec ProcessSpec) (*Process, error) {
	if spec.Binary == "" {
		return nil, errors.New("start vmm: no binary given")
	}
	logf, err := os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("start vmm: open log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("start vmm: %w", err)
	}
	defer devnull.Close()

	// Deliberately not exec.CommandContext: the VMM must outlive the
	// caller's context and the caller itself.
	cmd, release, err := spec.Confine.command(spec.Binary, spec.Args)
	if err != nil {
		return nil, fmt.Errorf("start vmm %s: %w", filepath.Base(spec.Binary), err)
	}
	cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, spec.Env...)
	cmd.Dir = spec.Dir
	cmd.Stdin = devnull
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.ExtraFiles = spec.ExtraFiles
	err = cmd.Start()
	release()
	if err != nil {
		return nil, fmt.Errorf("start vmm %s: %w", filepath.Base(spec.Binary), err)
	}
	p := &Process{pid: cmd.Process.Pid, done: make(chan struct{}), os: cmd.Process, pidfd: -1}
	go func() {
		err := cmd.Wait()
		if err == nil {
			err = errors.New("vmm process exited with status 0")
		}
		p.finish(fmt.Errorf("vmm process %d: %w", p.pid, err))
	}()
	if spec.PIDFile != "" {
		rec := pidRecord{PID: p.pid, Binary: spec.Binary}
		rec.StartTime, _ = processStartTime(p.pid)
		if err := atomicfile.WriteJSON(spec.PIDFile, rec, 0o644); err != nil {
			_ = p.Stop(time.Second)
			return nil, fmt.Errorf("start vmm: %w", err)
		}
	}
	return p, nil
}

// AdoptProcess re-attaches to a VMM process recorded in pidFile by an
// earlier StartProcess, typically in a daemon that restarted. It fails
// with ErrNotRunning when the process is gone or the PID now belongs to
// another process.
func AdoptProcess(pidFile string) (*Process, error) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("adopt vmm: no pid file %s: %w", pidFile, ErrNotRunning)
		}
		return nil, fmt.Errorf("adopt vmm: %w", err)
	}
	var rec pidRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.PID <= 0 {
		return nil, fmt.Errorf("adopt vmm: corrupt pid file %s", pidFile)
	}
	st, err := processStartTime(rec.PID)
	if err != nil || (rec.StartTime != 0 && st != rec.StartTime) {
		return nil, fmt.Errorf("adopt vmm: process %d is gone: %w", rec.PID, ErrNotRunning)
	}
	fd, err := unix.PidfdOpen(rec.PID, 0)
	if err != nil {
		return nil, fmt.Errorf("adopt vmm: pidfd of %d: %w", rec.PID, err)
	}
	p := &Process{pid: rec.PID, done: make(chan struct{}), pidfd: fd}
	go func() {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == unix.EINTR {
				continue
			}
			break
		}
		p.mu.Lock()
		unix.Close(p.pidfd)
		p.pidfd = -1
		p.mu.Unlock()
		p.finish(fmt.Errorf("vmm process %d (adopted) exited", p.pid))
	}()
	return p, nil
}

func (p *Process) finish(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	close(p.done)
}

// PID is the process id.
func (p *Process) PID() int { return p.pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Err says how the process exited, nil while it runs.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Alive reports whether the process still runs.
func (p *Process) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// File duplicates the process's file descriptor fd into this process
// (pidfd_getfd: the same open file, shared): how a new VMM takes over a
// device the running one holds, such as a TAP. The caller checks that
// the file is what it expects.
func (p *Process) File(fd int, name string) (*os.File, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.Alive() {
		return nil, fmt.Errorf("take fd %d of vmm process %d: %w", fd, p.pid, os.ErrProcessDone)
	}
	pidfd := p.pidfd // an adopted process's
	if p.os != nil {
		// A child not yet reaped (done is not closed) keeps its pid.
		var err error
		if pidfd, err = unix.PidfdOpen(p.pid, 0); err != nil {
			return nil, fmt.Errorf("take fd %d of vmm process %d: %w", fd, p.pid, err)
		}
		defer unix.Close(pidfd)
	}
	nfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return nil, fmt.Errorf("take fd %d of vmm process %d: %w", fd, p.pid, err)
	}
	return os.NewFile(uintptr(nfd), name), nil
}

// Stop sends SIGTERM, waits up to grace, then SIGKILL, and returns once
// the process is gone (or after a further bounded wait).
func (p *Process) Stop(grace time.Duration) error {
	if !p.Alive() {
		return nil
	}
	_ = p.signal(unix.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	return p.Kill()
}

// Kill sends SIGKILL at once and waits (bounded) until the process is
// gone: for a VMM whose guest state is thrown away, which needs neither
// a clean exit nor a flush of its devices.
func (p *Process) Kill() error {
	if !p.Alive() {
		return nil
	}
	_ = p.signal(unix.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stop vmm process %d: still alive after SIGKILL", p.pid)
	}
}

// signal sends sig through the process's pidfd; a process that exited
// is no error.
func (p *Process) signal(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.os != nil {
		err := p.os.Signal(sig)
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	if p.pidfd < 0 {
		return nil
	}
	return unix.PidfdSendSignal(p.pidfd, sig, nil, 0)
}

// Recorded reports whether the VMM process recorded in pidFile runs (the
// same process: its start time matches), without adopting it.
func Recorded(pidFile string) bool {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return false
	}
	var rec pidRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.PID <= 0 {
		return false
	}
	st, err := processStartTime(rec.PID)
	return err == nil && (rec.StartTime == 0 || st == rec.StartTime)
}

// processStartTime reads the start time (field 22 of /proc/PID/stat, in
// clock ticks since boot) that tells a process apart from a later one
// with the same PID.
func processStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	// The command name may hold spaces and parentheses; fields start
	// after the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); start time is field 22.
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	if f[0] == "Z" {
		return 0, fmt.Errorf("process %d is a zombie", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// TailFile returns up to the last n bytes of a file as one line, for error
// messages that point at a VMM log.
func TailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(buf)), " ")
}
