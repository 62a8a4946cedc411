//go:build linux

// Package procrec records the guest's processes (each exec and the exit
// that follows it, from eBPF programs on the scheduler's tracepoints),
// the files they write (from fanotify) and the connections they open
// (from eBPF connect hooks) into a bounded ring.
package procrec

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"
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
	// maxSession bounds a session tag.
	maxSession = 64
	// batchEvery is how long the recorder lets events gather after the
	// first one before it reads them all: one wake per batch, not one
	// per event, is what keeps the record cheap on a busy guest. A
	// Drain reads at once.
	batchEvery = 200 * time.Millisecond
	// batchMax bounds the records one batch reads from each source.
	batchMax = 8192
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
	ring  string
	log   *slog.Logger
	procs *procWatch // the process record's programs and ring (procs.go)

	sw     sync.Mutex // held while the record is switched on or off
	mu     sync.Mutex
	events []agent.ProcEvent // ring buffer, len == cap when full
	next   int               // where the next event goes
	seq    uint64            // sequence number of the newest event
	live   map[int]*live
	tags   map[int]string // pid → session, tagged by the agent
	closed bool
	paused bool
	fan    *fanWatch       // the file record, if any (files.go)
	conns  *connWatch      // the connection record, if any (conns.go)
	read   uint64          // the newest sequence number a Read returned
	drains []chan struct{} // Drains waiting for the next batch's end
	done   chan struct{}   // closed when run returns
	wake   int             // an eventfd: Drain, Close and WatchFiles wake run
	exited [patchBack]int  // the pids of the newest exits
	nexit  int
	gone   map[int]goneProc // processes that exited in the last goneFor
	pruned time.Time        // when gone was last pruned
}

// goneFor is how long what was known of a process is kept after its
// exit: its files may be read after it.
const goneFor = 5 * time.Second

type goneProc struct {
	session   string
	ppid, uid int
	at        time.Time
}

// Open loads the process record's eBPF programs on the scheduler's
// tracepoints and starts recording, keeping the newest size events. It
// fails when the kernel has no BTF or eBPF, or the caller may not load
// programs (CAP_BPF, CAP_PERFMON).
func Open(size int, log *slog.Logger) (*Recorder, error) {
	if size <= 0 {
		size = 8192
	}
	if log == nil {
		log = slog.Default()
	}
	procs, err := newProcWatch()
	if err != nil {
		return nil, fmt.Errorf("process record: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		procs.close()
		return nil, fmt.Errorf("process record: eventfd: %w", err)
	}
	if err := procs.hook(true); err != nil {
		procs.close()
		unix.Close(wake)
		return nil, fmt.Errorf("process record: %w", err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	r := &Recorder{
		ring: hex.EncodeToString(id[:]), log: log, procs: procs,
		events: make([]agent.ProcEvent, 0, size),
		live:   map[int]*live{},
		tags:   map[int]string{},
		gone:   map[int]goneProc{},
		done:   make(chan struct{}),
		wake:   wake,
	}
	go r.run()
	return r, nil
}

// kick wakes run: it reads what is queued at once.
func (r *Recorder) kick() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(r.wake, one[:])
}

// Close stops recording; what was recorded can still be read.
func (r *Recorder) Close() error {
	r.sw.Lock()
	defer r.sw.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	conns, fan := r.conns, r.fan
	r.mu.Unlock()
	err := r.procs.hook(false)
	if conns != nil {
		_ = conns.hook(false)
	}
	r.kick()
	// The fds are closed once run has returned.
	select {
	case <-r.done:
		r.procs.close()
		if conns != nil {
			conns.close()
		}
		if fan != nil {
			unix.Close(fan.fd)
		}
		unix.Close(r.wake)
	case <-time.After(time.Second):
		// run is stuck somewhere: leave the fds to the process's end
		// rather than close ones it may still use.
	}
	return err
}

// run waits for the first event of a batch, lets the others gather for
// batchEvery (unless a Drain or Close comes first), then reads them all.
func (r *Recorder) run() {
	defer close(r.done)
	var rec ringbuf.Record
	buf := make([]byte, 64<<10)
	for {
		r.mu.Lock()
		closed, fan, conns := r.closed, r.fan, r.conns
		r.mu.Unlock()
		if closed {
			return
		}
		pfd := []unix.PollFd{{Fd: int32(r.wake), Events: unix.POLLIN}, {Fd: int32(r.procs.ring.FD()), Events: unix.POLLIN}}
		if fan != nil {
			pfd = append(pfd, unix.PollFd{Fd: int32(fan.fd), Events: unix.POLLIN})
		}
		if conns != nil {
			pfd = append(pfd, unix.PollFd{Fd: int32(conns.ring.FD()), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(pfd, -1); err != nil && !errors.Is(err, unix.EINTR) {
			r.log.Warn("process record stopped", "err", err)
			return
		}
		if pfd[0].Revents == 0 {
			pfd = pfd[:1]
			if _, err := unix.Poll(pfd, int(batchEvery/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
				r.log.Warn("process record stopped", "err", err)
				return
			}
		}
		var eight [8]byte
		_, _ = unix.Read(r.wake, eight[:])
		r.batch(&rec, buf)
	}
}

// batch reads what the rings and the file record hold, handles it in
// the order it happened, then lets the Drains that came before it go.
func (r *Recorder) batch(rec *ringbuf.Record, buf []byte) {
	r.mu.Lock()
	drains, fan, conns := r.drains, r.fan, r.conns
	r.drains = nil
	r.mu.Unlock()
	defer func() {
		for _, ch := range drains {
			close(ch)
		}
	}()
	// Files are taken off their queue first and handled last: a file's
	// writer exec'd before it closed the file, so its exec is in the
	// rings read after.
	var files [][]byte
	if fan != nil {
		files = r.readFiles(fan, buf)
	}
	now := time.Now()
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	mono := ts.Nano()
	var evs []kernelEvent
	read := func(b *bpfSet, decode func([]byte) (kernelEvent, bool)) uint64 {
		for range batchMax {
			if err := b.rd.ReadInto(rec); err != nil {
				break
			}
			if e, ok := decode(rec.RawSample); ok {
				evs = append(evs, e)
			}
		}
		return b.lostSince()
	}
	lost := read(&r.procs.bpfSet, decodeProc)
	if conns != nil {
		lost += read(&conns.bpfSet, decodeConn)
	}
	// A connect goes between its process's exec and its exit.
	slices.SortStableFunc(evs, func(a, b kernelEvent) int { return cmp.Compare(a.mono, b.mono) })
	r.mu.Lock()
	for _, e := range evs {
		r.handle(e, now.Add(time.Duration(e.mono-mono)))
	}
	if lost > 0 {
		r.add(agent.ProcEvent{Time: now, Kind: agent.ProcLost, Lost: lost})
	}
	r.mu.Unlock()
	for _, b := range files {
		r.handleFiles(fan, b)
	}
	r.mu.Lock()
	if now.Sub(r.pruned) > goneFor {
		r.pruned = now
		for g, gp := range r.gone {
			if now.Sub(gp.at) > goneFor {
				delete(r.gone, g)
			}
		}
	}
	r.mu.Unlock()
}

// Drain handles the events the kernel has queued for the recorder and
// it has not read yet: a Read after it holds every process event, file
// close and connection that happened before it.
func (r *Recorder) Drain() {
	ch := make(chan struct{})
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.drains = append(r.drains, ch)
	r.mu.Unlock()
	r.kick()
	select {
	case <-ch:
	case <-r.done:
	case <-time.After(time.Second):
	}
}

// handle records one ring record, which happened at at (r.mu held).
func (r *Recorder) handle(e kernelEvent, at time.Time) {
	pid := int(e.pid)
	switch e.kind {
	case recFork:
		r.live[pid] = &live{ppid: int(e.parent)}
	case recExec:
		r.exec(pid, int(e.parent), int(e.val), at, e.argv, e.cut)
	case recExit:
		r.exit(pid, e.val, at)
	case recConnect:
		r.conn(e, at)
	}
}

// splitArgv cuts a NUL-separated command line of which the kernel
// copied b, whole bytes long, to the bounds.
func splitArgv(b []byte, whole int) ([]string, bool) {
	cut := whole > len(b)
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, cut
	}
	sum := 0
	var argv []string
	for i, a := range bytes.Split(b, []byte{0}) {
		if i == maxArgs || sum >= maxArgvSum {
			return argv, true
		}
		if len(a) > maxArgBytes {
			a, cut = a[:maxArgBytes], true
		}
		sum += len(a)
		argv = append(argv, string(a))
	}
	return argv, cut
}

// exec records an exec (r.mu held).
func (r *Recorder) exec(pid, ppid, uid int, at time.Time, argv []string, cut bool) {
	p := r.live[pid]
	if p == nil {
		p = &live{}
		r.live[pid] = p
	}
	// The parent the fork saw: one that has exited since leaves its
	// child to init, and its session would be lost on the way.
	if p.ppid == 0 {
		p.ppid = ppid
	}
	p.exec, p.uid = at, uid
	p.session = r.sessionOf(pid)
	r.add(agent.ProcEvent{Time: at, Kind: agent.ProcExec, PID: pid, PPID: p.ppid, UID: uid,
		Argv: argv, ArgvTruncated: cut, Session: p.session})
}

// exit records a process's end (r.mu held).
func (r *Recorder) exit(pid int, code uint32, at time.Time) {
	p := r.live[pid]
	// What is known of it is kept a moment: its last files are read
	// after its exit.
	g := goneProc{session: r.sessionOf(pid), uid: -1, at: at}
	if p != nil {
		g.ppid, g.uid = p.ppid, p.uid
	}
	r.gone[pid] = g
	delete(r.live, pid)
	delete(r.tags, pid)
	r.exited[r.nexit%patchBack] = pid
	r.nexit++
	if p == nil || p.exec.IsZero() {
		return // a fork that never exec'd, or one from before we listened
	}
	ev := agent.ProcEvent{Time: at, Kind: agent.ProcExit, PID: pid, PPID: p.ppid, UID: p.uid, Session: p.session,
		Duration: at.Sub(p.exec)}
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
		p := r.live[pid]
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
		p := r.live[pid]
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
			if p := r.live[ev.PID]; p != nil && p.session == "" {
				p.session = session
			}
		}
	}
}

// SetRecording switches the record off (the programs, the file marks
// and the connect hooks are let go: recording costs nothing then) or on
// again. What happened before it is switched off is recorded.
func (r *Recorder) SetRecording(on bool) error {
	r.sw.Lock()
	defer r.sw.Unlock()
	r.mu.Lock()
	closed, paused, fan, conns := r.closed, r.paused, r.fan, r.conns
	if on && !closed && paused {
		r.paused = false
	}
	r.mu.Unlock()
	switch {
	case closed:
		return errors.New("process record: closed")
	case paused == !on:
		return nil
	}
	hooks := []func(bool) error{func(on bool) error {
		if err := r.procs.hook(on); err != nil {
			return fmt.Errorf("process record: %w", err)
		}
		return nil
	}}
	if fan != nil {
		hooks = append(hooks, fan.mark)
	}
	if conns != nil {
		hooks = append(hooks, conns.hook)
	}
	for i, h := range hooks {
		if err := h(on); err != nil {
			for _, undo := range hooks[:i] {
				_ = undo(!on)
			}
			if on {
				r.mu.Lock()
				r.paused = true
				r.mu.Unlock()
			}
			return err
		}
	}
	if on {
		return nil
	}
	r.Drain()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused = true
	// What lived before cannot be followed to its exit.
	clear(r.live)
	clear(r.tags)
	clear(r.gone)
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
		if size += jsonBound(&ev); size > maxPageBytes && len(out.Events) > 0 {
			break
		}
		out.Events = append(out.Events, ev)
	}
	if k := len(out.Events); k > 0 && out.Events[k-1].Seq > r.read {
		r.read = out.Events[k-1].Seq
	}
	return out
}

// jsonBound is at least the length of ev in JSON, found without encoding
// it (costly in a guest under emulation): its names, numbers and time
// take at most fixedJSON; a string's bytes at most six each where JSON or
// HTML escaping or invalid UTF-8 may expand them.
func jsonBound(ev *agent.ProcEvent) int {
	const fixedJSON = 512
	n := fixedJSON
	for _, s := range ev.Argv {
		n += jsonStringBound(s)
	}
	for _, s := range []string{ev.Kind, ev.Session, ev.Signal, ev.Path, ev.Addr, ev.Proto, ev.Comm} {
		n += jsonStringBound(s)
	}
	return n
}

// jsonStringBound bounds s quoted in JSON, with a comma.
func jsonStringBound(s string) int {
	n := 3
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			n += 2
		case c < 0x20 || c >= 0x80 || c == '<' || c == '>' || c == '&':
			n += 6
		default:
			n++
		}
	}
	return n
}
