package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// Filter selects records; a zero field selects all.
type Filter struct {
	VM   string
	User string
	// Since keeps records whose Time is Since or later.
	Since time.Time
	// Limit keeps the last Limit records that match (0: all).
	Limit int
}

func (f Filter) match(r Record) bool {
	return (f.VM == "" || r.VM == f.VM) &&
		(f.User == "" || r.User == f.User) &&
		(f.Since.IsZero() || !r.Time.Before(f.Since))
}

// Query returns the records f selects, oldest first: the rotated files'
// (oldest first), then the current file's, as they were when Query
// began. Lines that are not a record (torn by a crash, or damaged) are
// skipped.
func (l *Log) Query(f Filter) ([]Record, error) {
	files, err := l.snapshot()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, sf := range files {
			sf.f.Close()
		}
	}()
	var out []Record
	for _, sf := range files {
		if err := scan(io.LimitReader(sf.f, sf.size), func(r Record) {
			if !f.match(r) {
				return
			}
			out = append(out, r)
			if f.Limit > 0 && len(out) > 2*f.Limit {
				out = append(out[:0], out[len(out)-f.Limit:]...)
			}
		}); err != nil {
			return nil, fmt.Errorf("query audit log %s: %w", sf.f.Name(), err)
		}
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out, nil
}

// snapFile is a log file open for reading, and how much of it to read.
type snapFile struct {
	f    *os.File
	size int64
}

// snapshot opens the rotated files, oldest first, and the current one,
// under l.mu: a rotation cannot move a file between two opens, and no
// write is half done at the current file's size taken.
func (l *Log) snapshot() ([]snapFile, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var files []snapFile
	fail := func(err error) ([]snapFile, error) {
		for _, sf := range files {
			sf.f.Close()
		}
		return nil, fmt.Errorf("query audit log: %w", err)
	}
	for n := l.opts.Keep; n >= 0; n-- {
		f, err := os.Open(l.path(n))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fail(err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return fail(err)
		}
		files = append(files, snapFile{f, st.Size()})
	}
	return files, nil
}

// scan calls each for every record line of r; a last line without its
// newline is torn and skipped.
func scan(r io.Reader, each func(Record)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return nil // a torn line, if any, ends the file
		}
		if err != nil {
			return err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var rec Record
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		each(rec)
	}
}
