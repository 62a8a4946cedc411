// Package activity keeps a VM's activity record: what ran in it, who
// started it, and what happened to the VM, as a bounded append-only log
// in a directory that lives with the VM's files.
package activity

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/denhq/den/agent"
)

// Entry kinds.
const (
	// KindExec and KindExit are a guest process started and ended.
	KindExec = agent.ProcExec
	KindExit = agent.ProcExit
	// KindFile is a file a guest process closed after writing it.
	KindFile = agent.ProcFile
	// KindConnect is a connection a guest process opened to an address
	// outside the guest.
	KindConnect = agent.ProcConnect
	// KindSecret is a use of one of den's secrets by the VM (Secret
	// names it, Detail says for what and how it went).
	KindSecret = "secret"
	// KindSession is a den session opened on the VM: an exec, an SSH
	// login, a URL request; its processes carry its id.
	KindSession = "session"
	// KindVM is something that happened to the VM (Event says what:
	// boot, sleep, wake, checkpoint, restore, fork, record).
	KindVM = "vm"
	// KindLost says events were dropped before den read them (the
	// guest's ring was full, or its record was off).
	KindLost = "lost"
)

// VM events (Entry.Event of a KindVM entry).
const (
	EventBoot       = "boot"
	EventSleep      = "sleep"
	EventWake       = "wake"
	EventCheckpoint = "checkpoint"
	EventRestore    = "restore"
	EventFork       = "fork"
	// EventRecord: the guest's record was switched on or off (Detail).
	EventRecord = "record"
)

// Cursor is how far den has read a guest's process record: the agent's
// ring and the sequence number of the last event read from it.
type Cursor struct {
	Ring string `json:"ring,omitempty"`
	Seq  uint64 `json:"seq,omitempty"`
}

// Entry is one line of the record.
type Entry struct {
	// N numbers the VM's entries from 1, in the order they were written.
	N    uint64    `json:"n"`
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`

	// Process events (exec, exit).
	PID           int           `json:"pid,omitempty"`
	PPID          int           `json:"ppid,omitempty"`
	UID           *int          `json:"uid,omitempty"`
	Argv          []string      `json:"argv,omitempty"`
	ArgvTruncated bool          `json:"argv_truncated,omitempty"`
	Status        *int          `json:"status,omitempty"`
	Signal        string        `json:"signal,omitempty"`
	Duration      time.Duration `json:"duration_ns,omitempty"`

	// A file written: its path, its size then, and how many closes
	// after a write it stands for.
	Path   string `json:"path,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	Writes int    `json:"writes,omitempty"`

	// A connection: the address and port, tcp or udp, the name den's
	// resolver gave the VM for that address (if it did), and the
	// process's name.
	Addr  string `json:"addr,omitempty"`
	Proto string `json:"proto,omitempty"`
	Name  string `json:"name,omitempty"`
	Comm  string `json:"comm,omitempty"`

	// Secret is the den secret a KindSecret entry used.
	Secret string `json:"secret,omitempty"`

	// Session is the session a process belongs to, or the one a
	// session entry opens.
	Session string `json:"session,omitempty"`
	// Who opened a session (a den user, with the token or key it used),
	// and Via what (exec, ssh, gateway, url).
	Who string `json:"who,omitempty"`
	Via string `json:"via,omitempty"`

	// Event is what happened to the VM (KindVM); Checkpoint is the
	// checkpoint it made or went back to, From the VM@checkpoint a fork
	// came from; Detail says more in words.
	Event      string `json:"event,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	From       string `json:"from,omitempty"`
	Detail     string `json:"detail,omitempty"`
	// Lost is how many process events were dropped (KindLost).
	Lost uint64 `json:"lost,omitempty"`

	// Cursor is where den had read the guest's record when the entry was
	// written; a checkpoint's says where a restore to it reads on from.
	Cursor Cursor `json:"cursor"`
}

// Bounds on what a guest's event may bring into the record: the guest
// is not trusted.
const (
	maxArgs    = 64
	maxArg     = 256
	maxPath    = 4096
	maxSession = 64
	maxSignal  = 16
	maxComm    = 16
)

// FromProc is the entry of a guest process event read from ring, cut
// to the record's bounds; ok is false for an event of a kind a guest
// does not make.
func FromProc(ring string, ev agent.ProcEvent) (e Entry, ok bool) {
	switch ev.Kind {
	case agent.ProcExec, agent.ProcExit, agent.ProcFile:
	case agent.ProcConnect:
		ap, err := netip.ParseAddrPort(ev.Addr)
		if err != nil || ev.Proto != "tcp" && ev.Proto != "udp" {
			return e, false
		}
		ev.Addr = ap.String()
	case agent.ProcLost:
		e := Entry{Time: ev.Time, Kind: KindLost, Detail: "the guest's kernel dropped process events (its agent did not read them in time)",
			Cursor: Cursor{Ring: ring, Seq: ev.Seq}}
		if ev.Lost > 0 {
			e.Lost, e.Detail = ev.Lost, "the guest's kernel could not record processes or connections (its ring was full between two reads)"
		}
		return e, true
	default:
		return e, false
	}
	e = Entry{Time: ev.Time, Kind: ev.Kind, PID: ev.PID, PPID: ev.PPID, ArgvTruncated: ev.ArgvTruncated,
		Status: ev.Status, Signal: cut(ev.Signal, maxSignal), Duration: ev.Duration, Session: cut(ev.Session, maxSession),
		Path: cut(ev.Path, maxPath), Bytes: ev.Bytes, Writes: ev.Writes, Addr: ev.Addr, Proto: ev.Proto, Comm: cut(ev.Comm, maxComm),
		Cursor: Cursor{Ring: ring, Seq: ev.Seq}}
	for i, a := range ev.Argv {
		if i == maxArgs {
			e.ArgvTruncated = true
			break
		}
		if len(a) > maxArg {
			a, e.ArgvTruncated = a[:maxArg], true
		}
		e.Argv = append(e.Argv, a)
	}
	if ev.UID >= 0 {
		uid := ev.UID
		e.UID = &uid
	}
	return e, true
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// File names in a record's directory: the record is two halves, the
// newer written to until it passes half the cap, then renamed over the
// older.
const (
	currentFile  = "current.jsonl"
	previousFile = "previous.jsonl"
	// tailRead is how much of the current half is read to find the last
	// entry when a Log is opened.
	tailRead = 256 << 10
)

// DefaultCap bounds a VM's record on the volume.
const DefaultCap = 16 << 20

// ErrNoCheckpoint is a checkpoint the record has no mark of (made before
// the record was kept, or dropped by its bound).
var ErrNoCheckpoint = errors.New("the activity record has no mark of this checkpoint")

// Log is a VM's record in a directory. Its methods are safe for
// concurrent use within one process; one process writes a VM's record
// at a time (the VM's owner).
type Log struct {
	dir  string
	cap  int64
	mu   sync.Mutex
	open bool   // last and cursor were read from the files
	last uint64 // N of the newest entry
	cur  Cursor
	torn bool // the current half does not end with a newline
}

// Open returns the record kept in dir (made on the first Append),
// bounded to about capBytes (0: DefaultCap).
func Open(dir string, capBytes int64) *Log {
	if capBytes <= 0 {
		capBytes = DefaultCap
	}
	return &Log{dir: dir, cap: capBytes}
}

// Dir is the record's directory.
func (l *Log) Dir() string { return l.dir }

// load reads the newest entry's number and cursor (l.mu held).
func (l *Log) load() error {
	if l.open {
		return nil
	}
	for _, name := range []string{currentFile, previousFile} {
		e, torn, ok, err := lastEntry(filepath.Join(l.dir, name))
		if err != nil {
			return err
		}
		if name == currentFile {
			l.torn = torn
		}
		if ok {
			l.last, l.cur = e.N, e.Cursor
			break
		}
	}
	l.open = true
	return nil
}

// lastEntry reads the last whole entry of a file.
func lastEntry(path string) (e Entry, torn, ok bool, err error) {
	tail, torn, err := readTail(path)
	if err != nil || len(tail) == 0 {
		return e, torn, false, err
	}
	return tail[len(tail)-1], torn, true, nil
}

// readTail reads the whole entries in the last tailRead bytes of a file
// (none when it is missing), and whether its last line is cut short.
func readTail(path string) (entries []Entry, torn bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("activity record: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, fmt.Errorf("activity record: %w", err)
	}
	off := st.Size() - tailRead
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, false, fmt.Errorf("activity record: %w", err)
	}
	torn = len(buf) > 0 && buf[len(buf)-1] != '\n'
	for _, line := range bytes.Split(buf, []byte{'\n'}) {
		var e Entry
		if json.Unmarshal(line, &e) == nil && e.N > 0 {
			entries = append(entries, e)
		}
	}
	return entries, torn, nil
}

// Cursor is where the record had read the guest's process record.
func (l *Log) Cursor() (Cursor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.load(); err != nil {
		return Cursor{}, err
	}
	return l.cur, nil
}

// Append writes entries, numbering them, and makes them durable. An
// entry without a cursor of its own gets the record's; the last entry's
// cursor becomes the record's.
func (l *Log) Append(entries ...Entry) error { return l.append(true, entries) }

// AppendLazy is Append without waiting for the volume to make the
// entries durable (marks on a request's path: a session's).
func (l *Log) AppendLazy(entries ...Entry) error { return l.append(false, entries) }

func (l *Log) append(durable bool, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.load(); err != nil {
		return err
	}
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return fmt.Errorf("activity record: %w", err)
	}
	var buf bytes.Buffer
	if l.torn {
		buf.WriteByte('\n') // a crash cut the last line short
	}
	n, cur := l.last, l.cur
	for _, e := range entries {
		n++
		e.N = n
		if e.Cursor.Ring == "" {
			e.Cursor = cur
		}
		cur = e.Cursor
		if e.Time.IsZero() {
			e.Time = time.Now()
		}
		e.Time = e.Time.UTC()
		b, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("activity record: %w", err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	path := filepath.Join(l.dir, currentFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("activity record: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	if err == nil && durable {
		err = f.Sync()
	}
	var size int64
	if st, serr := f.Stat(); serr == nil {
		size = st.Size()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		l.open = false // read what did land again next time
		return fmt.Errorf("activity record: %w", err)
	}
	l.last, l.cur, l.torn = n, cur, false
	if size > l.cap/2 {
		// The newer half is full: it becomes the older, dropping the
		// oldest half of the record.
		if err := os.Rename(path, filepath.Join(l.dir, previousFile)); err != nil {
			return fmt.Errorf("activity record: rotate: %w", err)
		}
		syncDir(l.dir)
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// Filter chooses entries.
type Filter struct {
	// After: only entries numbered above it (den activity --follow).
	After uint64
	// Since and Until bound the entries' times (zero: unbounded).
	Since, Until time.Time
	// Kinds keeps those kinds only (none: all).
	Kinds []string
	// Session keeps the entries of one session: the session's own entry
	// and its processes.
	Session string
	// Checkpoint, when set, gives the record up to that checkpoint's
	// instant along its own line: what a restore to a checkpoint before
	// it set aside is left out, as the checkpoint never held it.
	Checkpoint string
	// Last, when above 0, keeps only the newest Last entries chosen.
	Last int
}

func (f Filter) keep(e Entry) bool {
	if e.N <= f.After {
		return false
	}
	if !f.Since.IsZero() && e.Time.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && e.Time.After(f.Until) {
		return false
	}
	if len(f.Kinds) > 0 {
		found := false
		for _, k := range f.Kinds {
			found = found || k == e.Kind
		}
		if !found {
			return false
		}
	}
	return f.Session == "" || e.Session == f.Session
}

// Read returns the entries f chooses, oldest first.
func (l *Log) Read(f Filter) ([]Entry, error) {
	all, err := l.readAll()
	if err != nil {
		return nil, err
	}
	if f.Checkpoint != "" {
		if all, err = lineage(all, f.Checkpoint); err != nil {
			return nil, err
		}
	}
	out := all[:0]
	for _, e := range all {
		if f.keep(e) {
			out = append(out, e)
		}
	}
	if f.Last > 0 && len(out) > f.Last {
		out = out[len(out)-f.Last:]
	}
	return out, nil
}

// CursorAt is the cursor the record had when checkpoint id was taken:
// where a VM restored to it, or forked from it, reads its guest's record
// on from.
func (l *Log) CursorAt(id string) (Cursor, error) {
	is := func(e Entry) bool { return e.Kind == KindVM && e.Event == EventCheckpoint && e.Checkpoint == id }
	// A checkpoint just taken (a fork's, one a restore goes back to
	// soon after) is near the end.
	l.mu.Lock()
	tail, _, err := readTail(filepath.Join(l.dir, currentFile))
	l.mu.Unlock()
	if err != nil {
		return Cursor{}, err
	}
	for i := len(tail) - 1; i >= 0; i-- {
		if is(tail[i]) {
			return tail[i].Cursor, nil
		}
	}
	all, err := l.readAll()
	if err != nil {
		return Cursor{}, err
	}
	for i := len(all) - 1; i >= 0; i-- {
		if is(all[i]) {
			return all[i].Cursor, nil
		}
	}
	return Cursor{}, ErrNoCheckpoint
}

// readAll reads both halves, older first; lines a crash cut short are
// skipped.
func (l *Log) readAll() ([]Entry, error) {
	l.mu.Lock() // not across a rotation
	defer l.mu.Unlock()
	var out []Entry
	for _, name := range []string{previousFile, currentFile} {
		f, err := os.Open(filepath.Join(l.dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("activity record: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e Entry
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.N > 0 {
				out = append(out, e)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("activity record: %w", err)
		}
	}
	return out, nil
}

// lineage is the record up to checkpoint id's mark along its own line:
// each entry follows the one before it, but a restore to checkpoint c
// follows c's mark, setting aside what came between.
func lineage(all []Entry, id string) ([]Entry, error) {
	prev := make([]int, len(all))
	marks := map[string]int{} // checkpoint → index of its mark
	tip := -1
	for i, e := range all {
		prev[i] = tip
		if e.Kind == KindVM && e.Event == EventRestore {
			if k, ok := marks[e.Checkpoint]; ok {
				prev[i] = k
			}
		}
		if e.Kind == KindVM && e.Event == EventCheckpoint {
			marks[e.Checkpoint] = i
		}
		tip = i
	}
	k, ok := marks[id]
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: %w", id, ErrNoCheckpoint)
	}
	var out []Entry
	for ; k >= 0; k = prev[k] {
		out = append(out, all[k])
	}
	slices.Reverse(out)
	return out, nil
}
