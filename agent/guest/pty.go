//go:build linux

package guest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// runPTY runs cmd as a session leader on a new pseudo-terminal.
func (ss *session) runPTY(cmd *exec.Cmd, attr *syscall.SysProcAttr) exitInfo {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return ss.fail("open pty: %v", err)
	}
	if ss.pty.Rows > 0 && ss.pty.Cols > 0 {
		pty.Setsize(ptmx, &pty.Winsize{Rows: uint16(ss.pty.Rows), Cols: uint16(ss.pty.Cols)})
	}
	master, err := pollable(ptmx)
	if err != nil {
		tty.Close()
		return ss.fail("pty: %v", err)
	}
	defer master.Close()
	attr.Setsid, attr.Setctty, attr.Ctty = true, true, 0
	cmd.SysProcAttr = attr
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	err = ss.s.startProcess(cmd, cmd.Start)
	tty.Close()
	if err != nil {
		return ss.fail("start %s: %v", cmd.Path, err)
	}
	ss.setProc(&running{pid: cmd.Process.Pid, ptmx: master})
	stopWinch := make(chan struct{})
	defer close(stopWinch)
	go func() {
		for {
			select {
			case ws := <-ss.winch:
				setWinsize(master, ws.Rows, ws.Cols)
			case <-stopWinch:
				return
			}
		}
	}()
	go io.Copy(master, ss.ch)
	exited := make(chan struct{})
	outDone := make(chan struct{})
	go func() {
		pump(ss.ch, master, exited, ss.keep)
		close(outDone)
	}()
	werr := ss.wait(cmd)
	close(exited)
	master.SetReadDeadline(time.Now().Add(outputGrace))
	<-outDone
	return ss.status(cmd, werr)
}

// pollable turns creack/pty's master (left in blocking mode by its
// ioctls) into a non-blocking file on Go's poller, so that reads honour
// deadlines and Close interrupts them. It closes f.
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pty master: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), nil
}

// setWinsize sets a terminal's size without touching its blocking mode.
func setWinsize(f *os.File, rows, cols int) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	})
}

// foregroundGroup is the terminal's foreground process group, or 0.
func foregroundGroup(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	pg := 0
	rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil {
			pg = v
		}
	})
	return pg
}
