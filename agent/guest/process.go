//go:build linux

package guest

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/denhq/den/agent"
)

// DefaultPath is the PATH of session commands (the client may override).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// outputGrace: once a command has exited, its output is still copied while
// it keeps coming, and the session ends after this long without any (a
// background child holding the output open does not keep it forever).
const outputGrace = time.Second

// runCommand runs the user's shell: a login shell, or "shell -c line".
func (ss *session) runCommand(login bool, line string) exitInfo {
	acct, err := lookupAccount(ss.s.sys.EtcDir, ss.conn.User())
	if err != nil {
		return ss.fail("%v", err)
	}
	env, dir := ss.environment(acct)
	if st, err := os.Stat(dir); err != nil {
		return ss.fail("working directory: %v", err)
	} else if !st.IsDir() {
		return ss.fail("working directory %s: not a directory", dir)
	}
	cmd := &exec.Cmd{Path: acct.Shell, Env: env, Dir: dir}
	if login {
		cmd.Args = []string{"-" + filepath.Base(acct.Shell)}
	} else {
		cmd.Args = []string{filepath.Base(acct.Shell), "-c", line}
	}
	attr := &syscall.SysProcAttr{}
	if acct.UID != uint32(os.Getuid()) {
		attr.Credential = &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: acct.Groups}
	}
	if ss.agentFwd {
		sock, cleanup, err := ss.forwardAgent(acct)
		if err != nil {
			ss.log.Warn("agent forwarding", "err", err)
		} else {
			defer cleanup()
			cmd.Env = append(cmd.Env, "SSH_AUTH_SOCK="+sock)
		}
	}
	if ss.pty != nil {
		return ss.runPTY(cmd, attr)
	}
	return ss.runPipes(cmd, attr)
}

// environment is the command's environment and working directory: a base
// for the account, then the client's variables; DEN_WORKDIR is taken out
// and names the directory (relative to home).
func (ss *session) environment(a account) ([]string, string) {
	env := []string{
		"HOME=" + a.Home, "USER=" + a.Name, "LOGNAME=" + a.Name,
		"SHELL=" + a.Shell, "PATH=" + DefaultPath,
	}
	if sock := ss.s.keys.socket(); sock != "" {
		env = append(env, "SSH_AUTH_SOCK="+sock) // den's secrets; a forwarded agent comes after
	}
	if se := ss.s.secretEnv.Load(); se != nil {
		env = append(env, *se...)
	}
	if ss.pty != nil {
		term := ss.pty.Term
		if term == "" {
			term = "vt100"
		}
		env = append(env, "TERM="+term)
	}
	dir := a.Home
	for _, kv := range ss.env {
		if v, ok := strings.CutPrefix(kv, agent.EnvWorkdir+"="); ok {
			if v != "" {
				dir = v
			}
			continue
		}
		env = append(env, kv)
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(a.Home, dir)
	}
	return env, dir
}

// runPipes runs cmd in its own process group with pipes for its streams.
func (ss *session) runPipes(cmd *exec.Cmd, attr *syscall.SysProcAttr) exitInfo {
	attr.Setpgid = true
	cmd.SysProcAttr = attr
	var files []*os.File
	pipe := func() (*os.File, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil
		}
		files = append(files, r, w)
		return r, w
	}
	inR, inW := pipe()
	outR, outW := pipe()
	errR, errW := pipe()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if len(files) != 6 {
		return ss.fail("cannot create pipes")
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	err := ss.s.startProcess(cmd, cmd.Start)
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		return ss.fail("start %s: %v", cmd.Path, err)
	}
	ss.setProc(&running{pid: cmd.Process.Pid})
	go func() {
		io.Copy(inW, ss.ch)
		inW.Close()
	}()
	exited := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pump(ss.ch, outR, exited, ss.keep) }()
	go func() { defer wg.Done(); pump(ss.ch.Stderr(), errR, exited, ss.keep) }()
	werr := ss.wait(cmd)
	close(exited)
	outR.SetReadDeadline(time.Now().Add(outputGrace))
	errR.SetReadDeadline(time.Now().Add(outputGrace))
	wg.Wait()
	return ss.status(cmd, werr)
}

// pump copies src to dst until src ends, or, once exited is closed, until
// src has had nothing for outputGrace. If dst fails, src is closed so the
// writer gets EPIPE rather than blocking; with keep, src is read on and
// dropped instead, so that the writer runs on.
func pump(dst io.Writer, src *os.File, exited <-chan struct{}, keep bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				if !keep {
					src.Close()
					return
				}
				dst = io.Discard
			}
		}
		if err != nil {
			return
		}
		select {
		case <-exited:
			src.SetReadDeadline(time.Now().Add(outputGrace))
		default:
		}
	}
}

// status turns cmd's end into an SSH exit.
func (ss *session) status(cmd *exec.Cmd, err error) exitInfo {
	ps := cmd.ProcessState
	if ps == nil {
		ss.log.Warn("session command: no exit status", "err", err)
		return exitInfo{code: 255}
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return exitInfo{code: ps.ExitCode()}
	}
	if ws.Signaled() {
		if n := exitSignalName(ws.Signal()); n != "" {
			return exitInfo{signal: n, core: ws.CoreDump()}
		}
		return exitInfo{code: 128 + int(ws.Signal())}
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		ss.log.Warn("session command", "err", err)
	}
	return exitInfo{code: ws.ExitStatus()}
}

// startProcess runs start (which starts cmd) so that, when the agent is
// init, the reaper leaves the child to cmd.Wait.
func (s *Server) startProcess(cmd *exec.Cmd, start func() error) error {
	if s.cfg.Reaper != nil {
		return s.cfg.Reaper.Start(cmd, start)
	}
	return start()
}

func (s *Server) waitProcess(cmd *exec.Cmd) error {
	err := cmd.Wait()
	if s.cfg.Reaper != nil {
		s.cfg.Reaper.Forget(cmd.Process.Pid)
	}
	return err
}
