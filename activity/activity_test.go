package activity

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
)

func proc(ring string, seq uint64, kind string, pid int, session string, argv ...string) Entry {
	e, _ := FromProc(ring, agent.ProcEvent{Seq: seq, Time: time.Now(), Kind: kind, PID: pid, UID: 0, Argv: argv, Session: session})
	return e
}

func vmEvent(event, cp string) Entry {
	return Entry{Kind: KindVM, Event: event, Checkpoint: cp}
}

func pids(es []Entry) []int {
	var out []int
	for _, e := range es {
		out = append(out, e.PID)
	}
	return out
}

// TestAppendRead: entries are numbered, durable and filtered; a reopened
// record goes on from its last number and cursor, past a torn line.
func TestAppendRead(t *testing.T) {
	dir := t.TempDir()
	l := Open(dir, 0)
	if c, err := l.Cursor(); err != nil || c != (Cursor{}) {
		t.Fatalf("empty record's cursor %+v %v", c, err)
	}
	if err := l.Append(
		Entry{Kind: KindSession, Session: "s1", Who: "alice", Via: "exec"},
		proc("r1", 1, KindExec, 10, "s1", "make"),
		proc("r1", 2, KindExec, 11, "", "cron"),
		proc("r1", 3, KindExit, 10, "s1"),
	); err != nil {
		t.Fatal(err)
	}
	all, err := l.Read(Filter{})
	if err != nil || len(all) != 4 || all[0].N != 1 || all[3].N != 4 {
		t.Fatalf("read %+v %v", all, err)
	}
	if all[0].Cursor != (Cursor{}) || all[3].Cursor != (Cursor{Ring: "r1", Seq: 3}) {
		t.Errorf("cursors %+v, %+v", all[0].Cursor, all[3].Cursor)
	}
	got, _ := l.Read(Filter{Session: "s1"})
	if len(got) != 3 || got[0].Kind != KindSession {
		t.Errorf("session s1: %+v", got)
	}
	got, _ = l.Read(Filter{Kinds: []string{KindExec}})
	if !slices.Equal(pids(got), []int{10, 11}) {
		t.Errorf("execs: %v", pids(got))
	}
	got, _ = l.Read(Filter{After: 2, Last: 1})
	if len(got) != 1 || got[0].N != 4 {
		t.Errorf("after 2, last 1: %+v", got)
	}
	got, _ = l.Read(Filter{Since: time.Now().Add(time.Hour)})
	if len(got) != 0 {
		t.Errorf("since an hour ahead: %+v", got)
	}

	// A crash cut a line short: the reopened record skips it and goes on.
	f, err := os.OpenFile(filepath.Join(dir, currentFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"n":5,"kind":"ex`)
	f.Close()
	l = Open(dir, 0)
	if c, _ := l.Cursor(); c != (Cursor{Ring: "r1", Seq: 3}) {
		t.Errorf("reopened cursor %+v", c)
	}
	if err := l.Append(vmEvent(EventSleep, "")); err != nil {
		t.Fatal(err)
	}
	all, _ = l.Read(Filter{})
	if len(all) != 5 || all[4].N != 5 || all[4].Event != EventSleep || all[4].Cursor.Seq != 3 {
		t.Fatalf("after a torn line: %+v", all)
	}
}

// TestCap: the record stays within its cap, dropping its oldest half.
func TestCap(t *testing.T) {
	dir := t.TempDir()
	l := Open(dir, 8<<10)
	for i := 1; i <= 300; i++ {
		if err := l.Append(proc("r", uint64(i), KindExec, i, "", "cmd", strings.Repeat("x", 40))); err != nil {
			t.Fatal(err)
		}
	}
	var size int64
	for _, name := range []string{currentFile, previousFile} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err == nil {
			size += st.Size()
		}
	}
	if size > 8<<10+1024 {
		t.Errorf("record of %d bytes, cap 8 KiB", size)
	}
	all, _ := l.Read(Filter{})
	if len(all) == 0 || all[len(all)-1].PID != 300 || all[0].PID == 1 {
		t.Fatalf("kept %d entries, %d to %d", len(all), all[0].PID, all[len(all)-1].PID)
	}
	for i := 1; i < len(all); i++ {
		if all[i].N != all[i-1].N+1 {
			t.Fatalf("gap: %d after %d", all[i].N, all[i-1].N)
		}
	}
}

// TestLineage: a checkpoint's record is its own line: what a restore set
// aside is not in a checkpoint taken after it, but is in the one taken
// before the restore, and a restore's cursor is its checkpoint's.
func TestLineage(t *testing.T) {
	l := Open(t.TempDir(), 0)
	must := func(es ...Entry) {
		t.Helper()
		if err := l.Append(es...); err != nil {
			t.Fatal(err)
		}
	}
	must(proc("r", 1, KindExec, 1, ""), vmEvent(EventCheckpoint, "cp-1"))
	must(proc("r", 2, KindExec, 2, ""), vmEvent(EventCheckpoint, "cp-2"))
	must(proc("r", 3, KindExec, 3, ""))
	c1, err := l.CursorAt("cp-1")
	if err != nil || c1 != (Cursor{Ring: "r", Seq: 1}) {
		t.Fatalf("cp-1's cursor %+v %v", c1, err)
	}
	r := vmEvent(EventRestore, "cp-1")
	r.Cursor = c1
	must(r, proc("r", 2, KindExec, 4, ""), vmEvent(EventCheckpoint, "cp-3"))
	r = vmEvent(EventRestore, "cp-2")
	r.Cursor, _ = l.CursorAt("cp-2")
	must(r, proc("r", 3, KindExec, 5, ""), vmEvent(EventCheckpoint, "cp-4"))

	want := map[string][]int{"cp-1": {1, 0}, "cp-2": {1, 0, 2, 0}, "cp-3": {1, 0, 0, 4, 0}, "cp-4": {1, 0, 2, 0, 0, 5, 0}}
	for cp, w := range want {
		got, err := l.Read(Filter{Checkpoint: cp})
		if err != nil || !slices.Equal(pids(got), w) {
			t.Errorf("%s: pids %v (%v), want %v", cp, pids(got), err, w)
		}
	}
	if _, err := l.Read(Filter{Checkpoint: "cp-9"}); err == nil {
		t.Error("unknown checkpoint read")
	}
	all, _ := l.Read(Filter{})
	if len(all) != 11 {
		t.Errorf("the live record has %d entries, want all 11", len(all))
	}
	if c, _ := l.Cursor(); c != (Cursor{Ring: "r", Seq: 3}) {
		t.Errorf("cursor %+v", c)
	}
}

// TestFromProc: what a guest sends is cut to the record's bounds, and a
// kind a guest does not make is refused.
func TestFromProc(t *testing.T) {
	long := strings.Repeat("<", 10000)
	argv := make([]string, 100)
	for i := range argv {
		argv[i] = long
	}
	e, ok := FromProc("r", agent.ProcEvent{Seq: 1, Kind: KindExec, Argv: argv, Session: long, Path: long + long})
	if !ok || len(e.Argv) != maxArgs || len(e.Argv[0]) != maxArg || !e.ArgvTruncated || len(e.Session) != maxSession || len(e.Path) != maxPath {
		t.Errorf("not cut: %d args, first %d bytes, session %d, path %d", len(e.Argv), len(e.Argv[0]), len(e.Session), len(e.Path))
	}
	for _, kind := range []string{KindSession, KindVM, "x"} {
		if _, ok := FromProc("r", agent.ProcEvent{Seq: 1, Kind: kind}); ok {
			t.Errorf("a guest's event of kind %q taken", kind)
		}
	}
	if e, ok := FromProc("r", agent.ProcEvent{Seq: 2, Kind: agent.ProcLost}); !ok || e.Kind != KindLost {
		t.Errorf("lost: %+v", e)
	}
	e, ok = FromProc("r", agent.ProcEvent{Seq: 3, Kind: agent.ProcConnect, Addr: "10.0.0.1:443", Proto: "tcp", Comm: long})
	if !ok || e.Kind != KindConnect || e.Addr != "10.0.0.1:443" || e.Proto != "tcp" || len(e.Comm) != maxComm {
		t.Errorf("connect: %+v", e)
	}
	for _, bad := range []agent.ProcEvent{{Addr: "10.0.0.1", Proto: "tcp"}, {Addr: "x:1", Proto: "tcp"}, {Addr: "10.0.0.1:1", Proto: "sctp"}} {
		bad.Seq, bad.Kind = 4, agent.ProcConnect
		if _, ok := FromProc("r", bad); ok {
			t.Errorf("a connect event with addr %q proto %q taken", bad.Addr, bad.Proto)
		}
	}
}
