// Package audit keeps den's audit log: one JSON line per API call and gateway session.
//
// The log is dir/audit.log (mode 0600), rotated when it would grow past
// Options.MaxBytes to audit.log.1 (audit.log.2 the one before, up to
// Options.Keep files). Each record is one line written by one write(2)
// to a file opened for appending, so a line is never interleaved with
// another; a crash may leave a torn last line, which Query skips and the
// next Open closes off. Lines are not synced one by one: Close syncs.
package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Record is one audited event: an API call or a gateway session.
type Record struct {
	// Time is when the call or session began (UTC; Write sets it when
	// zero).
	Time  time.Time `json:"time"`
	User  string    `json:"user"`
	Admin bool      `json:"admin,omitempty"`
	// Source is how the caller reached den: "unix uid=1000",
	// "ssh 1.2.3.4:5678", "tls 1.2.3.4:5678 token tok_ab12cd34".
	Source string `json:"source"`
	// Verb is what was asked: "POST /v1/vms/{name}/sleep" (the route's
	// pattern, not the path), "ssh session", "den@ ls".
	Verb string `json:"verb"`
	VM   string `json:"vm,omitempty"`
	// Result is "ok", "404 not_found", "exit 1" or an error's text: one
	// line, at most MaxField bytes (Write makes it so).
	Result string `json:"result"`
	// Status is the HTTP status of an API call.
	Status int `json:"status,omitempty"`
	// Duration is how long the call or session took, in nanoseconds in
	// the JSON ("duration_ns").
	Duration time.Duration `json:"duration_ns"`
}

// MaxField bounds each string of a record as written, in bytes: a longer
// one is cut (at a character boundary) and ends in "...".
const MaxField = 512

// Defaults of Options.
const (
	DefaultMaxBytes = 16 << 20
	DefaultKeep     = 5
)

// Options tune a Log.
type Options struct {
	// MaxBytes is the size audit.log is rotated at (default
	// DefaultMaxBytes): a line that would take it past MaxBytes goes to a
	// new file.
	MaxBytes int64
	// Keep is how many rotated files are kept, audit.log.1 (the newest)
	// to audit.log.Keep (default DefaultKeep; negative keeps none).
	Keep int
}

// Log is an open audit log, safe for concurrent use.
type Log struct {
	dir  string
	opts Options

	mu   sync.Mutex // held for one write or rotation, never longer
	f    *os.File
	size int64
}

// FileName is the current log's name in its directory.
const FileName = "audit.log"

// Open opens (creating if needed) dir/audit.log for appending, mode
// 0600 (an existing file's mode is set to it too).
func Open(dir string, opts Options) (*Log, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	switch {
	case opts.Keep == 0:
		opts.Keep = DefaultKeep
	case opts.Keep < 0:
		opts.Keep = 0
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	l := &Log{dir: dir, opts: opts}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

// path is the current file's path, or with n > 0 the n-th rotated one's.
func (l *Log) path(n int) string {
	if n == 0 {
		return filepath.Join(l.dir, FileName)
	}
	return filepath.Join(l.dir, fmt.Sprintf("%s.%d", FileName, n))
}

// open opens the current file into l.f, ending a torn last line so the
// next record starts a line of its own.
func (l *Log) open() error {
	p := l.path(0)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open audit log: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("open audit log %s: %w", p, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open audit log %s: %w", p, err)
	}
	size := st.Size()
	if size > 0 {
		torn, err := endsTorn(p, size)
		if err != nil {
			f.Close()
			return fmt.Errorf("open audit log %s: %w", p, err)
		}
		if torn {
			n, err := f.Write([]byte{'\n'})
			size += int64(n)
			if err != nil {
				f.Close()
				return fmt.Errorf("open audit log %s: %w", p, err)
			}
		}
	}
	l.f, l.size = f, size
	return nil
}

// endsTorn says whether the file of this size does not end in a newline.
func endsTorn(path string, size int64) (bool, error) {
	r, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer r.Close()
	b := make([]byte, 1)
	if _, err := r.ReadAt(b, size-1); err != nil {
		return false, err
	}
	return b[0] != '\n', nil
}

// Write appends r as one line, rotating first when the line would take
// the file past MaxBytes. A failed rotation is reported, and the record
// still written to the current file.
func (l *Log) Write(r Record) error {
	line, err := encode(r)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return fmt.Errorf("write audit record: %w", os.ErrClosed)
	}
	var rerr error
	if l.size > 0 && l.size+int64(len(line)) > l.opts.MaxBytes {
		rerr = l.rotate()
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("write audit record: %w", err)
	}
	return rerr
}

// encode is r as one JSON line, its strings made one line and bounded.
func encode(r Record) ([]byte, error) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	for _, s := range []*string{&r.User, &r.Source, &r.Verb, &r.VM, &r.Result} {
		*s = clip(*s)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode audit record: %w", err)
	}
	return append(b, '\n'), nil
}

// clip makes s one line of valid UTF-8 of at most MaxField bytes.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.Fields(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)), " ")
	if len(s) <= MaxField {
		return s
	}
	cut := MaxField - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// Close syncs and closes the log; Write fails after it.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	serr := f.Sync()
	if err := f.Close(); err != nil {
		return fmt.Errorf("close audit log: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("close audit log: %w", serr)
	}
	return nil
}
