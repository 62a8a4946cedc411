//go:build linux

// Package procrec records the guest's processes (each exec and the exit
// that follows it, from the kernel's proc connector), the files they
// write (from fanotify) and the connections they open (from eBPF connect
// hooks) into a bounded ring.
package procrec

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/agent"
)

// Bounds of what one exec event keeps of its command line.
const (
	maxArgs     = 64
	maxArgBytes = 256
	maxArgvSum  = 2048
	// maxChain bounds the walk up a process's ancestors for its session.
	maxChain = 32
	// patchBack is how many of the newest events a Tag looks through
	// for processes that started before the tag was known.
	patchBack = 64
	// DefaultMax is the most events a Read returns.
	DefaultMax = 1024
	// maxPageBytes bounds a Read's events, JSON-encoded: the reply goes
	// in one SSH packet, and SSH closes a connection that carries a
	// packet over 256 KiB.
	maxPageBytes = 128 << 10
	// maxCmdline is how much of /proc/PID/cmdline is read.
	maxCmdline = 16 << 10
	// maxSession bounds a session tag.
	maxSession = 64
)

// Proc connector constants (linux/connector.h, linux/cn_proc.h).
const (
	cnIdxProc         = 1
	cnValProc         = 1
	procCnMcastListen = 1
	procEventFork     = 0x00000001
	procEventExec     = 0x00000002
	procEventExit     = 0x80000000
	nlmsgHdrLen       = 16
	cnMsgLen          = 20
	procEventHdrLen   = 16 // what, cpu, timestamp_ns
)

// live is what the recorder keeps of a process while it lives.
type live struct {
	ppid    int
	uid     int
	session string    // tagged on it, or found on an ancestor at exec
	exec    time.Time // its last exec; zero: it never exec'd since we saw it
}

// Recorder reads process events and keeps the newest in a ring.
type Recorder struct {
	fd   int
	ring string
	proc string // procfs mount
	log  *slog.Logger

	rx     sync.Mutex // held while a datagram or a fanotify batch is read and handled: they go in order
	mu     sync.Mutex
	events []agent.ProcEvent // ring buffer, len == cap when full
	next   int               // where the next event goes
	seq    uint64            // sequence number of the newest event
	procs  map[int]*live
	tags   map[int]string // pid → session, tagged by the agent
	closed bool
	paused bool
	fan    *fanWatch      // the file record, if any (files.go)
	conns  *connWatch     // the connection record, if any (conns.go)
	read   uint64         // the newest sequence number a Read returned
	done   chan struct{}  // closed when run returns
	wake   int            // an eventfd Close writes to: run's poll returns
	exited [patchBack]int // the pids of the newest exits
	nexit  int
	gone   map[int]goneProc // sessions of processes that exited in the last goneFor
}

// goneFor is how long a process's session is kept after its exit.
const goneFor = 5 * time.Second

type goneProc struct {
	session string
	at      time.Time
}

// Open subscribes to the proc connector and starts recording, keeping
// the newest size events. It fails when the kernel has no proc connector
// or the caller may not listen (CAP_NET_ADMIN).
func Open(size int, log *slog.Logger) (*Recorder, error) {
	if size <= 0 {
		size = 8192
	}
	if log == nil {
		log = slog.Default()
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("process record: netlink connector socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("process record: bind to the proc connector: %w", err)
	}
	// A burst of forks must not overflow the socket between reads
	// (FORCE: past rmem_max, the agent being root).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	if err := listen(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("process record: subscribe to the proc connector: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("process record: eventfd: %w", err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	r := &Recorder{
		fd: fd, ring: hex.EncodeToString(id[:]), proc: "/proc", log: log,
		events: make([]agent.ProcEvent, 0, size),
		procs:  map[int]*live{},
		tags:   map[int]string{},
		gone:   map[int]goneProc{},
		done:   make(chan struct{}),
		wake:   wake,
	}
	go r.run()
	return r, nil
}

// listen sends PROC_CN_MCAST_LISTEN (or _IGNORE).
func listen(fd int, on bool) error {
	op := uint32(procCnMcastListen)
	if !on {
		op = 2
	}
	msg := make([]byte, nlmsgHdrLen+cnMsgLen+4)
	le := binary.LittleEndian
	le.PutUint32(msg[0:], uint32(len(msg)))
	le.PutUint16(msg[4:], unix.NLMSG_DONE)
	cn := msg[nlmsgHdrLen:]
	le.PutUint32(cn[0:], cnIdxProc)
	le.PutUint32(cn[4:], cnValProc)
	le.PutUint16(cn[16:], 4)
	le.PutUint32(cn[cnMsgLen:], op)
	return unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// Close stops recording; what was recorded can still be read.
func (r *Recorder) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	conns := r.conns
	r.mu.Unlock()
	_ = listen(r.fd, false)
	if conns != nil {
		conns.close()
	}
	// The eventfd wakes run's poll; the fds are closed once run has
	// returned.
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, err := unix.Write(r.wake, one[:])
	select {
	case <-r.done:
		r.rx.Lock()
		unix.Close(r.fd)
		r.fd = -1
		r.rx.Unlock()
		unix.Close(r.wake)
	case <-time.After(time.Second):
		// run is stuck somewhere: leave the fds to the process's end
		// rather than close ones it may still use.
	}
	return err
}

func (r *Recorder) run() {
	defer close(r.done)
	buf := make([]byte, 64<<10)
	for {
		pfd := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}, {Fd: int32(r.wake), Events: unix.POLLIN}}
		_, perr := unix.Poll(pfd, -1)
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return
		}
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			r.log.Warn("process record stopped", "err", perr)
			return
		}
		if _, err := r.recvProc(buf); err != nil {
			r.log.Warn("process record stopped", "err", err)
			return
		}
	}
}

// recvProc reads and handles one datagram of the proc connector, if one
// is waiting; got says one was.
func (r *Recorder) recvProc(buf []byte) (got bool, err error) {
	r.rx.Lock()
	defer r.rx.Unlock()
	if r.fd < 0 {
		return false, nil
	}
	n, from, err := unix.Recvfrom(r.fd, buf, unix.MSG_DONTWAIT)
	switch {
	case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
		return false, nil
	case errors.Is(err, unix.ENOBUFS):
		r.mu.Lock()
		r.add(agent.ProcEvent{Time: time.Now(), Kind: agent.ProcLost})
		r.mu.Unlock()
		return true, nil
	case err != nil:
		return false, err
	case n == 0:
		return false, nil
	}
	if nl, ok := from.(*unix.SockaddrNetlink); ok && nl.Pid == 0 { // only the kernel speaks for the proc connector
		r.parse(buf[:n])
	}
	return true, nil
}

// drainMax bounds the datagrams a Drain reads from each source.
const drainMax = 8192

// Drain handles the events the kernel has queued for the recorder and
// its reader has not read yet: a Read after it holds every process
// event and file close that happened before it.
func (r *Recorder) Drain() {
	buf := make([]byte, 64<<10)
	// Files first: a process's writes come before its exit, which ends
	// what is known of it (its session).
	r.mu.Lock()
	fan, conns := r.fan, r.conns
	r.mu.Unlock()
	if conns != nil {
		if lost := conns.drain(); lost > 0 {
			r.mu.Lock()
			r.add(agent.ProcEvent{Time: time.Now(), Kind: agent.ProcLost, Lost: lost})
			r.mu.Unlock()
		}
	}
	for i := 0; fan != nil && i < drainMax; i++ {
		if got, err := r.recvFiles(fan, buf); !got || err != nil {
			break
		}
	}
	for i := 0; i < drainMax; i++ {
		if got, err := r.recvProc(buf); !got || err != nil {
			break
		}
	}
}

// parse handles one datagram of netlink messages.
func (r *Recorder) parse(b []byte) {
	le := binary.LittleEndian
	for len(b) >= nlmsgHdrLen {
		l := int(le.Uint32(b[0:]))
		if l < nlmsgHdrLen || l > len(b) {
			return
		}
		msg := b[nlmsgHdrLen:l]
		b = b[min((l+3)&^3, len(b)):]
		if len(msg) < cnMsgLen+procEventHdrLen {
			continue
		}
		if le.Uint32(msg[0:]) != cnIdxProc || le.Uint32(msg[4:]) != cnValProc {
			continue
		}
		ev := msg[cnMsgLen:]
		what := le.Uint32(ev[0:])
		data := ev[procEventHdrLen:]
		switch what {
		case procEventFork:
			if len(data) >= 16 {
				ppid, tgid, pid := int(le.Uint32(data[4:])), int(le.Uint32(data[12:])), int(le.Uint32(data[8:]))
				if pid == tgid { // a process, not a thread
					r.fork(ppid, pid)
				}
			}
		case procEventExec:
			if len(data) >= 8 && le.Uint32(data[0:]) == le.Uint32(data[4:]) {
				r.exec(int(le.Uint32(data[4:])))
			}
		case procEventExit:
			if len(data) >= 16 && le.Uint32(data[0:]) == le.Uint32(data[4:]) {
				r.exit(int(le.Uint32(data[4:])), le.Uint32(data[8:]))
			}
		}
	}
}

func (r *Recorder) fork(ppid, pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs[pid] = &live{ppid: ppid}
}

func (r *Recorder) exec(pid int) {
	now := time.Now()
	argv, cut := r.argv(pid)
	r.mu.Lock()
	p := r.procs[pid]
	r.mu.Unlock()
	// The parent is known from the fork; the uid is the owner of the
	// process's /proc directory: a stat, where /proc/PID/status would be
	// an open, a read and a close (costly under emulation).
	ppid, uid := 0, -1
	var st unix.Stat_t
	if unix.Stat(r.proc+"/"+strconv.Itoa(pid), &st) == nil {
		uid = int(st.Uid)
	}
	if p == nil || uid < 0 {
		ppid, uid = r.status(pid)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p = r.procs[pid]
	if p == nil {
		p = &live{ppid: ppid}
		r.procs[pid] = p
	}
	if ppid > 0 {
		p.ppid = ppid
	}
	p.exec, p.uid = now, uid
	p.session = r.sessionOf(pid)
	r.add(agent.ProcEvent{Time: now, Kind: agent.ProcExec, PID: pid, PPID: p.ppid, UID: uid,
		Argv: argv, ArgvTruncated: cut, Session: p.session})
}

func (r *Recorder) exit(pid int, code uint32) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[pid]
	// Its session is kept a moment: its last writes may be read after
	// its exit (files and processes come through two readers).
	if s := r.sessionOf(pid); s != "" {
		r.gone[pid] = goneProc{session: s, at: now}
	}
	for g, gp := range r.gone {
		if now.Sub(gp.at) > goneFor {
			delete(r.gone, g)
		}
	}
	delete(r.procs, pid)
	delete(r.tags, pid)
	r.exited[r.nexit%patchBack] = pid
	r.nexit++
	if p == nil || p.exec.IsZero() {
		return // a fork that never exec'd, or one from before we listened
	}
	ev := agent.ProcEvent{Time: now, Kind: agent.ProcExit, PID: pid, PPID: p.ppid, UID: p.uid, Session: p.session,
		Duration: now.Sub(p.exec)}
	ws := syscall.WaitStatus(code)
	switch {
	case ws.Signaled():
		ev.Signal = unix.SignalName(ws.Signal())
		if ev.Signal == "" {
			ev.Signal = strconv.Itoa(int(ws.Signal()))
		}
	default:
		st := ws.ExitStatus()
		ev.Status = &st
	}
	r.add(ev)
}

// sessionOf is the session tagged on pid or its nearest ancestor
// (r.mu held).
func (r *Recorder) sessionOf(pid int) string {
	for i := 0; i < maxChain && pid > 1; i++ {
		if s, ok := r.tags[pid]; ok {
			return s
		}
		p := r.procs[pid]
		if p == nil {
			return r.gone[pid].session
		}
		if p.session != "" {
			return p.session
		}
		pid = p.ppid
	}
	return ""
}

// descends says whether pid is root or one of its descendants as far
// as the recorder knows (r.mu held).
func (r *Recorder) descends(pid, root int) bool {
	for i := 0; i < maxChain && pid > 1; i++ {
		if pid == root {
			return true
		}
		p := r.procs[pid]
		if p == nil {
			return false
		}
		pid = p.ppid
	}
	return false
}

// add appends ev to the ring (r.mu held).
func (r *Recorder) add(ev agent.ProcEvent) {
	if r.paused {
		return // queued before the record was switched off
	}
	r.seq++
	ev.Seq = r.seq
	if len(r.events) < cap(r.events) {
		r.events = append(r.events, ev)
		r.next = len(r.events) % cap(r.events)
		return
	}
	r.events[r.next] = ev
	r.next = (r.next + 1) % len(r.events)
}

// Tag puts pid and its descendants in session: the agent calls it when
// it started a session's command. Events of pid and its descendants
// recorded before the tag (the exec comes before the agent learns the
// pid) are tagged too, among the newest few.
func (r *Recorder) Tag(pid int, session string) {
	if session == "" || pid <= 1 {
		return
	}
	if len(session) > maxSession {
		session = session[:maxSession]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.exited[:], pid) {
		// A pid whose exit was seen is not tagged: it may be reused.
		// One whose fork is not read yet is: its exit removes the tag.
		r.tags[pid] = session
	}
	n := len(r.events)
	for i := 0; i < patchBack && i < n; i++ {
		j := (r.next - 1 - i + 2*n) % n
		ev := &r.events[j]
		if ev.Session != "" {
			continue
		}
		if ev.PID == pid || ev.PPID == pid || r.descends(ev.PPID, pid) {
			ev.Session = session
			if p := r.procs[ev.PID]; p != nil && p.session == "" {
				p.session = session
			}
		}
	}
}

// SetRecording switches the record off (the proc connector and the
// file marks are let go: recording costs nothing then) or on again.
func (r *Recorder) SetRecording(on bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("process record: closed")
	}
	if r.paused == !on {
		return nil
	}
	if err := listen(r.fd, on); err != nil {
		return fmt.Errorf("process record: %w", err)
	}
	if r.fan != nil {
		if err := r.fan.mark(on); err != nil {
			return err
		}
	}
	if r.conns != nil {
		if err := r.conns.hook(on); err != nil {
			return err
		}
	}
	r.paused = !on
	if !on {
		// What lived before cannot be followed to its exit.
		clear(r.procs)
		clear(r.tags)
		clear(r.gone)
	}
	return nil
}

// Ring names this recorder: events are numbered within it.
func (r *Recorder) Ring() string { return r.ring }

// Read returns up to limit events after sequence number after, oldest
// first, and no more than fit in maxPageBytes of JSON (at least one).
func (r *Recorder) Read(after uint64, limit int) agent.ProcLogReply {
	if limit <= 0 || limit > DefaultMax {
		limit = DefaultMax
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := agent.ProcLogReply{Ring: r.ring, Last: r.seq, Paused: r.paused, Events: []agent.ProcEvent{}}
	n := len(r.events)
	if n == 0 {
		return out
	}
	oldest := r.seq - uint64(n) + 1
	out.Oldest = oldest
	if after >= r.seq {
		return out
	}
	from := max(after+1, oldest)
	size := 0
	for s := from; s <= r.seq && len(out.Events) < limit; s++ {
		ev := r.events[(r.next-int(r.seq-s)-1+2*n)%n]
		b, _ := json.Marshal(ev)
		if size += len(b) + 1; size > maxPageBytes && len(out.Events) > 0 {
			break
		}
		out.Events = append(out.Events, ev)
	}
	if k := len(out.Events); k > 0 && out.Events[k-1].Seq > r.read {
		r.read = out.Events[k-1].Seq
	}
	return out
}

// argv reads a process's command line, cut to the bounds.
func (r *Recorder) argv(pid int) ([]string, bool) {
	b, err := readBounded(r.proc+"/"+strconv.Itoa(pid)+"/cmdline", maxCmdline)
	if err != nil || len(b) == 0 {
		comm, _ := os.ReadFile(r.proc + "/" + strconv.Itoa(pid) + "/comm")
		if c := strings.TrimSpace(string(comm)); c != "" {
			return []string{"[" + c + "]"}, false
		}
		return nil, false
	}
	b = bytes.TrimSuffix(b, []byte{0})
	parts := bytes.Split(b, []byte{0})
	cut := false
	sum := 0
	var argv []string
	for i, p := range parts {
		if i == maxArgs || sum >= maxArgvSum {
			cut = true
			break
		}
		if len(p) > maxArgBytes {
			p, cut = p[:maxArgBytes], true
		}
		sum += len(p)
		argv = append(argv, string(p))
	}
	return argv, cut
}

// readBounded reads at most n bytes of a file.
func readBounded(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := io.ReadFull(f, b)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return b[:k], err
}

// status reads a process's parent and effective uid.
func (r *Recorder) status(pid int) (ppid, uid int) {
	b, err := os.ReadFile(r.proc + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, -1
	}
	uid = -1
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "PPid":
			ppid, _ = strconv.Atoi(f[0])
		case "Uid":
			if len(f) > 1 {
				uid, _ = strconv.Atoi(f[1]) // real, effective, saved, fs
			}
			return ppid, uid
		}
	}
	return ppid, uid
}
