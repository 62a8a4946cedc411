package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func open(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// lines reads a file's lines, each checked to be one whole record.
func lines(t *testing.T, path string) []Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("%s does not end in a newline", path)
	}
	var out []Record
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var r Record
		if err := dec.Decode(&r); err != nil || dec.More() {
			t.Fatalf("%s: a line that is not one record: %q (%v)", path, sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestWriteRecord(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	when := time.Date(2025, 3, 1, 12, 0, 0, 5, time.FixedZone("x", 3600))
	r := Record{Time: when, User: "alice", Admin: true, Source: "unix uid=1000", Verb: "POST /v1/vms/{name}/sleep",
		VM: "box", Result: "404 not_found", Status: 404, Duration: 1500 * time.Microsecond}
	if err := l.Write(r); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time":"2025-03-01T11:00:00.000000005Z","user":"alice","admin":true,"source":"unix uid=1000","verb":"POST /v1/vms/{name}/sleep","vm":"box","result":"404 not_found","status":404,"duration_ns":1500000}` + "\n"
	if string(b) != want {
		t.Fatalf("line:\n%s\nwant:\n%s", b, want)
	}
	// A multi-line, long, invalid-UTF-8 result is one bounded line.
	if err := l.Write(Record{User: "bob", Verb: "den@ ls", Result: "line one\nline two\r\x00\xff" + strings.Repeat("é", 1000)}); err != nil {
		t.Fatal(err)
	}
	got := lines(t, filepath.Join(dir, FileName))
	if len(got) != 2 {
		t.Fatalf("%d records", len(got))
	}
	res := got[1].Result
	if len(res) > MaxField || !strings.HasPrefix(res, "line one line two \uFFFD") || !strings.HasSuffix(res, "é...") {
		t.Fatalf("result %q (%d bytes)", res, len(res))
	}
	if got[1].Time.IsZero() || got[1].Admin || got[1].VM != "" {
		t.Fatalf("defaults: %+v", got[1])
	}
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	// An existing file's looser mode is tightened.
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	l := open(t, dir, Options{MaxBytes: 300, Keep: 2})
	for i := range 10 {
		if err := l.Write(Record{User: "u", Verb: fmt.Sprint(i), Result: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{FileName, FileName + ".1", FileName + ".2"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, st.Mode().Perm())
		}
	}
	// A new log in a new directory: 0600 whatever the umask lets through.
	dir2 := filepath.Join(t.TempDir(), "state")
	open(t, dir2, Options{})
	if st, err := os.Stat(filepath.Join(dir2, FileName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("new log: %v %v", st.Mode(), err)
	}
}

// TestConcurrentWrites: many writers, rotating meanwhile; every line is
// one whole record, none lost, none doubled.
func TestConcurrentWrites(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"one file", Options{}},
		{"rotating", Options{MaxBytes: 16 << 10, Keep: 1000}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			l := open(t, dir, c.opts)
			const writers, each = 24, 150
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						r := Record{User: fmt.Sprintf("u%d", w), Verb: fmt.Sprintf("POST /v1/vms/%d", i),
							Source: strings.Repeat("s", w*7%200), Result: "ok", Duration: time.Duration(i)}
						if err := l.Write(r); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			// Queries meanwhile see whole records only.
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range 5 {
					if _, err := l.Query(Filter{}); err != nil {
						errs <- err
						return
					}
				}
			}()
			wg.Wait()
			<-done
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			files, _ := filepath.Glob(filepath.Join(dir, FileName+"*"))
			if c.opts.MaxBytes > 0 && len(files) < 2 {
				t.Fatalf("no rotation: %v", files)
			}
			seen := map[string]bool{}
			for _, f := range files {
				for _, r := range lines(t, f) {
					k := r.User + " " + r.Verb
					if seen[k] {
						t.Fatalf("record %s twice", k)
					}
					seen[k] = true
				}
			}
			if len(seen) != writers*each {
				t.Fatalf("%d records in the files, want %d", len(seen), writers*each)
			}
			all, err := l.Query(Filter{})
			if err != nil || len(all) != writers*each {
				t.Fatalf("query: %d records, %v", len(all), err)
			}
			// Each writer's records come back in its order.
			last := map[string]time.Duration{}
			for _, r := range all {
				if d, ok := last[r.User]; ok && r.Duration <= d {
					t.Fatalf("%s: record %d after %d", r.User, r.Duration, d)
				}
				last[r.User] = r.Duration
			}
		})
	}
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	const max, keep = 1 << 10, 3
	l := open(t, dir, Options{MaxBytes: max, Keep: keep})
	const n = 200
	for i := range n {
		if err := l.Write(Record{User: "u", Verb: "v", Result: "ok", Status: i + 1}); err != nil {
			t.Fatal(err)
		}
	}
	var kept int
	for i := 0; i <= keep+1; i++ {
		name := FileName
		if i > 0 {
			name = fmt.Sprintf("%s.%d", FileName, i)
		}
		path := filepath.Join(dir, name)
		st, err := os.Stat(path)
		if i == keep+1 {
			if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s kept beyond Keep: %v", name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.Size() > max {
			t.Errorf("%s: %d bytes, over %d", name, st.Size(), max)
		}
		kept += len(lines(t, path))
	}
	all, err := l.Query(Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != kept || len(all) >= n {
		t.Fatalf("query: %d records, files hold %d, %d written", len(all), kept, n)
	}
	// Oldest first, across the files, up to the last one written.
	for i, r := range all {
		if want := n - len(all) + i + 1; r.Status != want {
			t.Fatalf("record %d: status %d, want %d", i, r.Status, want)
		}
	}

	// Reopened: the size is known, rotation goes on where it was.
	l.Close()
	l = open(t, dir, Options{MaxBytes: max, Keep: keep})
	if err := l.Write(Record{User: "u", Verb: "v", Result: "ok", Status: n + 1}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, FileName)); err != nil || st.Size() > max {
		t.Fatalf("after reopen: %v %v", st.Size(), err)
	}
	last, err := l.Query(Filter{Limit: 1})
	if err != nil || len(last) != 1 || last[0].Status != n+1 {
		t.Fatalf("last after reopen: %+v %v", last, err)
	}
}

func TestRotationKeepNone(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{MaxBytes: 500, Keep: -1})
	for i := range 50 {
		if err := l.Write(Record{User: "u", Verb: "v", Result: "ok", Status: i + 1}); err != nil {
			t.Fatal(err)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(dir, FileName+".*")); len(files) != 0 {
		t.Fatalf("rotated files kept: %v", files)
	}
	all, err := l.Query(Filter{})
	if err != nil || len(all) == 0 || all[len(all)-1].Status != 50 {
		t.Fatalf("query: %+v %v", all, err)
	}
}

func TestQueryFilters(t *testing.T) {
	l := open(t, t.TempDir(), Options{MaxBytes: 600, Keep: 100})
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	type rec struct{ user, vm string }
	recs := []rec{{"alice", "a1"}, {"bob", "b1"}, {"alice", "a2"}, {"alice", "a1"}, {"bob", ""}, {"alice", "a1"}}
	for i, r := range recs {
		if err := l.Write(Record{Time: t0.Add(time.Duration(i) * time.Minute), User: r.user, VM: r.vm, Verb: "v", Result: "ok", Status: i}); err != nil {
			t.Fatal(err)
		}
	}
	statuses := func(f Filter) string {
		t.Helper()
		rs, err := l.Query(f)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, r := range rs {
			s = append(s, fmt.Sprint(r.Status))
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		f    Filter
		want string
	}{
		{Filter{}, "0,1,2,3,4,5"},
		{Filter{VM: "a1"}, "0,3,5"},
		{Filter{User: "bob"}, "1,4"},
		{Filter{User: "alice", VM: "a2"}, "2"},
		{Filter{User: "carol"}, ""},
		{Filter{Since: t0.Add(3 * time.Minute)}, "3,4,5"},
		{Filter{Since: t0.Add(3*time.Minute + 1)}, "4,5"},
		{Filter{Limit: 2}, "4,5"},
		{Filter{Limit: 10}, "0,1,2,3,4,5"},
		{Filter{VM: "a1", Since: t0.Add(time.Minute), Limit: 1}, "5"},
		{Filter{User: "alice", Limit: 3}, "2,3,5"},
	} {
		if got := statuses(c.f); got != c.want {
			t.Errorf("%+v: %s, want %s", c.f, got, c.want)
		}
	}
}

// TestTornLine: a crash's torn last line is skipped, as are damaged
// lines, and the next record after a reopen is a line of its own.
func TestTornLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	l := open(t, dir, Options{})
	for i := range 3 {
		if err := l.Write(Record{User: "u", Verb: "v", Result: "ok", Status: i + 1}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"time":"2025-01-01T00:00:00Z","user":"torn","verb":"v","res`); err != nil {
		t.Fatal(err)
	}
	f.Close()

	l = open(t, dir, Options{})
	got, err := l.Query(Filter{})
	if err != nil || len(got) != 3 {
		t.Fatalf("query with a torn line: %+v %v", got, err)
	}
	if err := l.Write(Record{User: "u", Verb: "v", Result: "ok", Status: 4}); err != nil {
		t.Fatal(err)
	}
	got, err = l.Query(Filter{})
	if err != nil || len(got) != 4 || got[3].Status != 4 {
		t.Fatalf("query after the next write: %+v %v", got, err)
	}
	// Damaged lines amid whole ones.
	l.Close()
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("garbage\n\n{\"user\":\x00}\n[1]\n")
	f.Close()
	l = open(t, dir, Options{})
	if err := l.Write(Record{User: "u", Verb: "v", Result: "ok", Status: 5}); err != nil {
		t.Fatal(err)
	}
	got, err = l.Query(Filter{User: "u"})
	if err != nil || len(got) != 5 || got[4].Status != 5 {
		t.Fatalf("query with damaged lines: %+v %v", got, err)
	}
}

func TestClosed(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(Record{User: "u", Verb: "v", Result: "ok"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := l.Write(Record{}); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if got, err := l.Query(Filter{}); err != nil || len(got) != 1 {
		t.Fatalf("query after close: %+v %v", got, err)
	}
}
