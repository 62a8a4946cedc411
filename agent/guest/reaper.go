//go:build linux

package guest

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reaper reaps orphaned zombies when the agent is init (or a
// subreaper), without stealing the exit status of processes the agent
// waits for itself: those are started through Start, and the reaper only
// ever peeks (WNOWAIT) before reaping a child nobody else waits for.
type Reaper struct {
	log *slog.Logger

	mu      sync.Mutex // held while starting a process and while reaping
	tracked map[int]bool
	kick    chan struct{}
}

// NewReaper returns a reaper; run it with Run.
func NewReaper(log *slog.Logger) *Reaper {
	return &Reaper{log: log, tracked: map[int]bool{}, kick: make(chan struct{}, 1)}
}

// Start runs start, which starts cmd, and tracks its pid; the caller
// must call cmd.Wait and then Forget.
func (r *Reaper) Start(cmd *exec.Cmd, start func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := start(); err != nil {
		return err
	}
	r.tracked[cmd.Process.Pid] = true
	return nil
}

// Forget stops tracking a waited-for pid.
func (r *Reaper) Forget(pid int) {
	r.mu.Lock()
	delete(r.tracked, pid)
	r.mu.Unlock()
	r.Kick()
}

// Kick makes Run look for zombies now.
func (r *Reaper) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run reaps on every SIGCHLD (and every few seconds) until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		for i := 0; i < 1000 && r.ReapOnce(); i++ {
		}
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-r.kick:
		case <-tick.C:
		}
	}
}

// ReapOnce reaps at most one untracked zombie. It reports whether to call
// it again: a zombie was reaped, or a tracked one (about to be waited
// for by its owner) hides the others for a moment.
func (r *Reaper) ReapOnce() bool {
	r.mu.Lock()
	var info unix.Siginfo
	err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	pid := siginfoPid(&info)
	if err != nil || pid <= 0 {
		r.mu.Unlock()
		return false
	}
	if r.tracked[pid] {
		r.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return true
	}
	var ws unix.WaitStatus
	_, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	r.mu.Unlock()
	if err == nil {
		r.log.Debug("reaped orphan", "pid", pid, "status", ws.ExitStatus())
	}
	return true
}

// siginfoPid is si_pid of a SIGCHLD siginfo: the union follows si_signo,
// si_errno and si_code, aligned to a pointer (offset 16 on 64-bit Linux,
// 12 on 32-bit).
func siginfoPid(info *unix.Siginfo) int {
	off := 12
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	b := (*[32]byte)(unsafe.Pointer(info))
	return int(int32(binary.NativeEndian.Uint32(b[off : off+4])))
}
