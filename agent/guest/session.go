//go:build linux

package guest

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/denhq/den/agent"
	"github.com/gliderlabs/ssh"
	"github.com/pkg/sftp"
	gossh "golang.org/x/crypto/ssh"
)

// hangupGrace is how long a session's processes get after SIGHUP (the
// client closed the channel or the connection ended) before SIGKILL.
const hangupGrace = 5 * time.Second

// SSH request payloads (RFC 4254).
type (
	ptyReqMsg struct {
		Term                 string
		Cols, Rows, Wpx, Hpx uint32
		Modes                string
	}
	winChangeMsg struct{ Cols, Rows, Wpx, Hpx uint32 }
	envMsg       struct{ Name, Value string }
	stringMsg    struct{ Value string }
	exitStatus   struct{ Status uint32 }
	exitSignal   struct {
		Signal     string
		CoreDumped bool
		Error      string
		Lang       string
	}
)

// session is one "session" channel.
type session struct {
	s    *Server
	ch   gossh.Channel
	conn *gossh.ServerConn
	log  *slog.Logger

	// Set by the request loop before the command starts.
	env      []string
	pty      *ptyReqMsg
	agentFwd bool
	started  bool
	keep     bool   // EnvKeep: the command outlives the session
	tag      string // EnvSession: its session in the process record

	winch chan agent.WindowSize // latest size, for the running PTY
	done  chan struct{}         // closed when the command has finished

	mu     sync.Mutex
	proc   *running
	hungUp bool
	exited bool // the command's process has been waited for
}

// running is the started process of a session.
type running struct {
	pid  int
	ptmx *os.File // nil without a PTY
}

func (s *Server) handleSession(_ *ssh.Server, conn *gossh.ServerConn, nc gossh.NewChannel, _ ssh.Context) {
	if s.closing.Load() {
		nc.Reject(gossh.ResourceShortage, "agent is shutting down")
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	s.sessions.Add(1)
	ss := &session{
		s: s, ch: ch, conn: conn, log: s.log,
		winch: make(chan agent.WindowSize, 1),
		done:  make(chan struct{}),
	}
	if !ss.serve(reqs) {
		s.sessions.Add(-1)
	}
}

// serve handles the channel's requests until the channel closes, then
// hangs up the command and waits for it. A command kept (EnvKeep) stops
// counting as a session once its channel is gone: released is true when
// serve took it off the count itself.
func (ss *session) serve(reqs <-chan *gossh.Request) (released bool) {
	for req := range reqs {
		ok, start := ss.handle(req)
		if req.WantReply {
			req.Reply(ok, nil)
		}
		if start != nil {
			go func() {
				defer close(ss.done)
				ss.exit(start())
			}()
		}
	}
	if !ss.started {
		ss.ch.Close()
		return false
	}
	ss.hangup()
	if ss.keep {
		ss.s.sessions.Add(-1)
		released = true
	}
	<-ss.done
	return released
}

// handle answers one request; for shell, exec and subsystem it returns
// the function that runs the command, started after the reply.
func (ss *session) handle(req *gossh.Request) (bool, func() exitInfo) {
	switch req.Type {
	case "env":
		var m envMsg
		if ss.started || gossh.Unmarshal(req.Payload, &m) != nil {
			return false, nil
		}
		if m.Name == agent.EnvKeep {
			ss.keep = m.Value == "1"
			return true, nil
		}
		if m.Name == agent.EnvSession {
			// The first is den's own (the daemon sends it before any of
			// the client's): a client's cannot replace it.
			if ss.tag == "" {
				ss.tag = m.Value
			}
			return true, nil
		}
		ss.env = append(ss.env, m.Name+"="+m.Value)
		return true, nil
	case "pty-req":
		var m ptyReqMsg
		if ss.started || ss.pty != nil || gossh.Unmarshal(req.Payload, &m) != nil {
			return false, nil
		}
		ss.pty = &m
		return true, nil
	case "window-change":
		var m winChangeMsg
		if ss.pty == nil || gossh.Unmarshal(req.Payload, &m) != nil {
			return false, nil
		}
		ws := agent.WindowSize{Rows: int(m.Rows), Cols: int(m.Cols)}
		if !ss.started {
			ss.pty.Rows, ss.pty.Cols = m.Rows, m.Cols
			return true, nil
		}
		select { // keep only the latest size
		case <-ss.winch:
		default:
		}
		ss.winch <- ws
		return true, nil
	case "auth-agent-req@openssh.com":
		if ss.started {
			return false, nil
		}
		ss.agentFwd = true
		return true, nil
	case "signal":
		var m stringMsg
		if gossh.Unmarshal(req.Payload, &m) != nil {
			return false, nil
		}
		return ss.signal(m.Value), nil
	case "shell", "exec", "subsystem":
		if ss.started {
			return false, nil
		}
		var m stringMsg
		if req.Type != "shell" && gossh.Unmarshal(req.Payload, &m) != nil {
			return false, nil
		}
		switch req.Type {
		case "subsystem":
			if m.Value != "sftp" {
				return false, nil
			}
			ss.started = true
			return true, ss.runSFTP
		case "shell":
			ss.started = true
			return true, func() exitInfo { return ss.runCommand(true, "") }
		default:
			ss.started = true
			return true, func() exitInfo { return ss.runCommand(false, m.Value) }
		}
	}
	return false, nil
}

// exitInfo is how a session's command ended.
type exitInfo struct {
	code   int
	signal string // SSH signal name when killed by a signal
	core   bool
}

// exit reports the status and closes the channel.
func (ss *session) exit(st exitInfo) {
	ss.ch.CloseWrite()
	if st.signal != "" {
		ss.ch.SendRequest("exit-signal", false, gossh.Marshal(exitSignal{Signal: st.signal, CoreDumped: st.core}))
	} else {
		ss.ch.SendRequest("exit-status", false, gossh.Marshal(exitStatus{Status: uint32(st.code)}))
	}
	ss.ch.Close()
}

// fail reports a setup failure on stderr.
func (ss *session) fail(format string, args ...any) exitInfo {
	msg := fmt.Sprintf(format, args...)
	ss.log.Warn("session setup failed", "err", msg)
	fmt.Fprintf(ss.ch.Stderr(), "den-agent: %s\n", msg)
	return exitInfo{code: agent.ExitSetupFailed}
}

// setProc records the started process; if the channel already closed,
// the process is hung up at once.
func (ss *session) setProc(p *running) {
	if rec := ss.s.cfg.ProcRecord; rec != nil && ss.tag != "" {
		rec.Tag(p.pid, ss.tag)
	}
	ss.mu.Lock()
	ss.proc = p
	hung := ss.hungUp
	ss.mu.Unlock()
	if hung && !ss.keep {
		ss.hangupProc(p)
	}
}

// wait waits for the command's process and records that it has exited.
func (ss *session) wait(cmd *exec.Cmd) error {
	err := ss.s.waitProcess(cmd)
	ss.mu.Lock()
	ss.exited = true
	ss.mu.Unlock()
	return err
}

// signal delivers an SSH signal to the command's process group (with a
// PTY: the terminal's foreground group).
func (ss *session) signal(name string) bool {
	sig, ok := signalsByName[name]
	if !ok {
		return false
	}
	ss.mu.Lock()
	p := ss.proc
	ss.mu.Unlock()
	if p == nil {
		return false
	}
	pgrp := p.pid
	if p.ptmx != nil {
		if fg := foregroundGroup(p.ptmx); fg > 0 {
			pgrp = fg
		}
	}
	return syscall.Kill(-pgrp, sig) == nil
}

// hangup ends a command whose channel closed: SIGHUP to its process group
// (and the terminal hung up), SIGKILL after hangupGrace.
//
// Once the command's own process has exited, nothing is signalled: what it
// left running in the background (`daemon &`) is the user's to keep, even
// when the client closes the channel before the agent is done sending the
// exit status.
func (ss *session) hangup() {
	ss.mu.Lock()
	p := ss.proc
	ss.hungUp = true
	exited := ss.exited
	ss.mu.Unlock()
	if p != nil && !exited && !ss.keep {
		ss.hangupProc(p)
	}
}

func (ss *session) hangupProc(p *running) {
	if p.ptmx != nil {
		p.ptmx.Close()
	}
	syscall.Kill(-p.pid, syscall.SIGHUP)
	t := time.AfterFunc(hangupGrace, func() { syscall.Kill(-p.pid, syscall.SIGKILL) })
	go func() {
		<-ss.done
		t.Stop()
	}()
}

func (ss *session) runSFTP() exitInfo {
	acct, err := lookupAccount(ss.s.sys.EtcDir, ss.conn.User())
	if err != nil {
		return ss.fail("%v", err)
	}
	srv, err := sftp.NewServer(ss.ch, sftp.WithServerWorkingDirectory(acct.Home))
	if err != nil {
		return ss.fail("sftp: %v", err)
	}
	// Not srv.Close(): it closes the channel, and the exit status that
	// exit sends next would be lost (scp and sftp then fail).
	err = srv.Serve()
	if err != nil && err != io.EOF {
		ss.log.Info("sftp session ended", "err", err)
		return exitInfo{code: 1}
	}
	return exitInfo{}
}

// exitSignals are the signal names of RFC 4254, the ones a client can
// turn into an exit status (128+n).
var exitSignals = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE,
	"HUP": syscall.SIGHUP, "ILL": syscall.SIGILL, "INT": syscall.SIGINT,
	"KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE, "QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

// signalsByName are the signals a client may send.
var signalsByName = func() map[string]syscall.Signal {
	m := map[string]syscall.Signal{
		"CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP,
		"TSTP": syscall.SIGTSTP, "WINCH": syscall.SIGWINCH,
	}
	for n, s := range exitSignals {
		m[n] = s
	}
	return m
}()

// exitSignalName is the RFC 4254 name of sig, or "" for other signals.
func exitSignalName(sig syscall.Signal) string {
	for n, s := range exitSignals {
		if s == sig {
			return n
		}
	}
	return ""
}
