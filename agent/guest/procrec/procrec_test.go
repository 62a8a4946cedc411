//go:build linux

package procrec

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/testutil"
)

func open(t *testing.T, size int) *Recorder {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the eBPF programs need root")
	}
	r, err := Open(size, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// waitFor reads the recorder until match finds an event, for up to 10 s.
func waitFor(t *testing.T, r *Recorder, match func(agent.ProcEvent) bool) agent.ProcEvent {
	t.Helper()
	var found agent.ProcEvent
	testutil.WaitForWithin(t, 10*time.Second, "an event that matches", func() bool {
		for _, ev := range r.Read(0, 0).Events {
			if match(ev) {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// TestRecord: a command's exec (argv, uid, parent), its child's exec in
// the same session, and both exits (status, signal) are recorded.
func TestRecord(t *testing.T) {
	r := open(t, 0)
	cmd := exec.Command("/bin/sh", "-c", "read x; /bin/sh -c 'kill -TERM $$'; exit 3")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	r.Tag(pid, "exec:alice:1")
	in.Write([]byte("go\n"))
	in.Close()
	_ = cmd.Wait()

	ex := waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcExec && ev.PID == pid })
	if !slices.Equal(ex.Argv, cmd.Args) || ex.UID != 0 || ex.PPID != os.Getpid() || ex.Session != "exec:alice:1" {
		t.Errorf("exec event %+v, want argv %q uid 0 ppid %d session exec:alice:1", ex, cmd.Args, os.Getpid())
	}
	child := waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcExec && ev.PPID == pid })
	if child.Session != "exec:alice:1" {
		t.Errorf("child %+v: not in the parent's session", child)
	}
	cexit := waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcExit && ev.PID == child.PID })
	if cexit.Signal != "SIGTERM" || cexit.Status != nil || cexit.Session != "exec:alice:1" {
		t.Errorf("child's exit %+v, want SIGTERM", cexit)
	}
	exit := waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcExit && ev.PID == pid })
	if exit.Status == nil || *exit.Status != 3 || exit.Duration <= 0 {
		t.Errorf("exit event %+v, want status 3 and a duration", exit)
	}
	// Sequence numbers grow; a read after one starts after it.
	all := r.Read(0, 0)
	for i := 1; i < len(all.Events); i++ {
		if all.Events[i].Seq != all.Events[i-1].Seq+1 {
			t.Fatalf("sequence not contiguous: %d after %d", all.Events[i].Seq, all.Events[i-1].Seq)
		}
	}
	if got := r.Read(ex.Seq, 1).Events; len(got) != 1 || got[0].Seq != ex.Seq+1 {
		t.Errorf("read after %d: %+v", ex.Seq, got)
	}
}

// TestRing: the ring keeps the newest events only and says where it
// starts.
func TestRing(t *testing.T) {
	r := open(t, 4)
	for i := 0; i < 5; i++ {
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForWithin(t, 10*time.Second, "10 events", func() bool { return r.Read(0, 0).Last >= 10 })
	got := r.Read(0, 0)
	if got.Last < 10 || len(got.Events) != 4 || got.Oldest != got.Last-3 || got.Events[0].Seq != got.Oldest {
		t.Fatalf("ring of 4 after 10+ events: last %d oldest %d events %d", got.Last, got.Oldest, len(got.Events))
	}
	if page := r.Read(got.Last, 0); len(page.Events) != 0 {
		t.Errorf("read after the newest: %+v", page.Events)
	}
}

// TestFiles: a file closed after a write under a watched path is
// recorded with its writer, session and size; writes elsewhere are not;
// quick rewrites by one process are one event.
func TestFiles(t *testing.T) {
	r := open(t, 0)
	dir, other := t.TempDir(), t.TempDir()
	if err := r.WatchFiles([]string{dir, "/nonexistent"}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", "read x; for i in 1 2 3; do echo line >> "+dir+"/log; done; echo x > "+other+"/no")
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Tag(cmd.Process.Pid, "s2")
	in.Write([]byte("go\n"))
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	// Every close is handled before the first read: an event den has
	// read takes no more merges.
	r.Drain()
	ev := waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcFile && ev.Path == dir+"/log" })
	if ev.PID != cmd.Process.Pid || ev.Session != "s2" || ev.Writes < 1 {
		t.Errorf("file event %+v: want pid %d, session s2", ev, cmd.Process.Pid)
	}
	// The kernel may merge the closes, and the recorder merges what
	// comes within a moment: one event, with the last size.
	waitFor(t, r, func(ev agent.ProcEvent) bool {
		return ev.Kind == agent.ProcFile && ev.Path == dir+"/log" && ev.Bytes == 15
	})
	n := 0
	for _, e := range r.Read(0, 0).Events {
		if e.Kind == agent.ProcFile && e.Path != dir+"/log" {
			t.Errorf("a file outside the watched paths: %+v", e)
		}
		if e.Kind == agent.ProcFile {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d file events for three appends in a moment, want 1", n)
	}
}

// TestSwitchedOff: nothing is recorded while the record is off; it goes
// on when switched on again.
func TestSwitchedOff(t *testing.T) {
	r := open(t, 0)
	dir := t.TempDir()
	if err := r.WatchFiles([]string{dir}); err != nil {
		t.Fatal(err)
	}
	if err := r.SetRecording(false); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("/bin/sh", "-c", "echo off-marker > "+dir+"/off").Run(); err != nil {
		t.Fatal(err)
	}
	if err := r.SetRecording(true); err != nil {
		t.Fatal(err)
	}
	// It lives until its exec is seen: the command line is read from
	// the live process.
	on := exec.Command("/bin/sh", "-c", "echo on-marker > "+dir+"/on; read x")
	in, _ := on.StdinPipe()
	if err := on.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcFile && ev.Path == dir+"/on" })
	waitFor(t, r, func(ev agent.ProcEvent) bool {
		return ev.Kind == agent.ProcExec && slices.Contains(ev.Argv, "echo on-marker > "+dir+"/on; read x")
	})
	in.Close()
	_ = on.Wait()
	for _, ev := range r.Read(0, 0).Events {
		if ev.Path == dir+"/off" || slices.Contains(ev.Argv, "echo off-marker > "+dir+"/off") {
			t.Errorf("recorded while off: %+v", ev)
		}
	}
	if r.Read(0, 0).Paused {
		t.Error("paused after switched on")
	}
}

// TestDrain: once a command has ended, a Drain and a Read hold its exec,
// its exit and the file it wrote, with no wait: the kernel queued them
// before its parent saw it end.
func TestDrain(t *testing.T) {
	r := open(t, 0)
	dir := t.TempDir()
	if err := r.WatchFiles([]string{dir}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		marker := fmt.Sprintf("drain-%d", i)
		cmd := exec.Command("/bin/sh", "-c", "echo "+marker+" > "+dir+"/"+marker)
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		r.Drain()
		var ex, exit, file bool
		for _, ev := range r.Read(0, 0).Events {
			ex = ex || ev.Kind == agent.ProcExec && ev.PID == cmd.Process.Pid
			exit = exit || ev.Kind == agent.ProcExit && ev.PID == cmd.Process.Pid
			file = file || ev.Kind == agent.ProcFile && ev.Path == dir+"/"+marker
		}
		if !ex || !exit || !file {
			t.Fatalf("run %d: exec %v, exit %v, file %v right after it ended", i, ex, exit, file)
		}
	}
}

// TestConnections: a connect to an address outside the host is recorded
// (process, uid, address, port, protocol) and is in a Read right after
// a Drain; one to loopback is not; none while the record is off. (UDP
// connects send nothing: no traffic leaves this machine.)
func TestConnections(t *testing.T) {
	r := open(t, 0)
	if err := r.WatchConnections(); err != nil {
		t.Fatal(err)
	}
	connect := func(network, addr string) {
		t.Helper()
		c, err := net.Dial(network, addr)
		if err == nil {
			c.Close()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	find := func(addr string) (agent.ProcEvent, bool) {
		for _, ev := range r.Read(0, 0).Events {
			if ev.Kind == agent.ProcConnect && ev.Addr == addr {
				return ev, true
			}
		}
		return agent.ProcEvent{}, false
	}
	for i := range 5 {
		addr := fmt.Sprintf("192.0.2.%d:53", 10+i)
		connect("tcp", ln.Addr().String())
		connect("udp", addr)
		r.Drain()
		ev, ok := find(addr)
		if !ok {
			t.Fatalf("round %d: connect to %s not in the record after a drain", i, addr)
		}
		if ev.PID != os.Getpid() || ev.UID != 0 || ev.Proto != "udp" || ev.Comm == "" {
			t.Errorf("connect event %+v, want pid %d uid 0 udp and a comm", ev, os.Getpid())
		}
	}
	connect("udp6", "[2001:db8::1]:443")
	waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcConnect && ev.Addr == "[2001:db8::1]:443" })
	if _, ok := find(ln.Addr().String()); ok {
		t.Error("a loopback connect was recorded")
	}

	if err := r.SetRecording(false); err != nil {
		t.Fatal(err)
	}
	connect("udp", "192.0.2.99:53")
	r.Drain()
	if _, ok := find("192.0.2.99:53"); ok {
		t.Error("a connect while the record was off was recorded")
	}
	if err := r.SetRecording(true); err != nil {
		t.Fatal(err)
	}
	connect("udp", "192.0.2.98:53")
	waitFor(t, r, func(ev agent.ProcEvent) bool { return ev.Kind == agent.ProcConnect && ev.Addr == "192.0.2.98:53" })
}

// TestShortLived: processes that end before the recorder reads anything
// keep their whole command line, parent, uid, status and times (the
// kernel copies them at exec); a long command line is cut and says so.
func TestShortLived(t *testing.T) {
	r := open(t, 0)
	before := time.Now()
	var pids []int
	for i := range 30 {
		cmd := exec.Command("/bin/true", fmt.Sprintf("short-%d", i))
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	long := exec.Command("/bin/true", strings.Repeat("a", 300), strings.Repeat("b", 5000))
	if err := long.Run(); err != nil {
		t.Fatal(err)
	}
	r.Drain()
	after := time.Now()
	byPID := map[int][]agent.ProcEvent{}
	for _, ev := range r.Read(0, 0).Events {
		byPID[ev.PID] = append(byPID[ev.PID], ev)
	}
	for i, pid := range pids {
		evs := byPID[pid]
		if len(evs) != 2 || evs[0].Kind != agent.ProcExec || evs[1].Kind != agent.ProcExit {
			t.Fatalf("process %d: events %+v, want its exec and its exit", i, evs)
		}
		ex, end := evs[0], evs[1]
		if want := []string{"/bin/true", fmt.Sprintf("short-%d", i)}; !slices.Equal(ex.Argv, want) || ex.ArgvTruncated {
			t.Errorf("process %d: argv %q (cut %v), want %q", i, ex.Argv, ex.ArgvTruncated, want)
		}
		if ex.PPID != os.Getpid() || ex.UID != 0 || end.Status == nil || *end.Status != 0 {
			t.Errorf("process %d: exec %+v exit %+v", i, ex, end)
		}
		// Times are the kernel's, put on the wall clock.
		slack := 100 * time.Millisecond
		if ex.Time.Before(before.Add(-slack)) || end.Time.After(after.Add(slack)) || end.Time.Before(ex.Time) || end.Duration != end.Time.Sub(ex.Time) {
			t.Errorf("process %d: exec at %v, exit at %v after %v; ran between %v and %v", i, ex.Time, end.Time, end.Duration, before, after)
		}
	}
	evs := byPID[long.Process.Pid]
	if len(evs) == 0 || evs[0].Kind != agent.ProcExec {
		t.Fatalf("long command line: events %+v", evs)
	}
	if a := evs[0].Argv; len(a) != 3 || a[1] != strings.Repeat("a", maxArgBytes) || !evs[0].ArgvTruncated {
		t.Errorf("long command line: %d args, cut %v", len(a), evs[0].ArgvTruncated)
	}
}

// TestScratchIgnored: the kernel drops the closes of files right under
// a scratch directory (the recorder never reads them), while closes in
// another directory outside the watched paths still reach it.
func TestScratchIgnored(t *testing.T) {
	scratch, other, watched := t.TempDir(), t.TempDir(), t.TempDir()
	old := scratchDirs
	scratchDirs = []string{scratch}
	t.Cleanup(func() { scratchDirs = old })
	r := open(t, 0)
	if err := r.WatchFiles([]string{watched}); err != nil {
		t.Fatal(err)
	}
	outside := func() int64 {
		r.Drain()
		return r.fan.outside.Load()
	}
	write := func(dir string) {
		t.Helper()
		for i := range 5 {
			if err := os.WriteFile(fmt.Sprintf("%s/f%d", dir, i), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(scratch)
	if n := outside(); n != 0 {
		t.Errorf("%d closes under the scratch directory reached the recorder", n)
	}
	write(other)
	if n := outside(); n < 1 {
		t.Errorf("no close in another directory reached the recorder: is the file system's mark there?")
	}
	write(watched)
	r.Drain()
	n := 0
	for _, ev := range r.Read(0, 0).Events {
		if ev.Kind == agent.ProcFile && strings.HasPrefix(ev.Path, watched+"/") {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d of 5 files written in the watched directory recorded", n)
	}
}

// TestJSONBound: the bound a Read pages by is never under an event's
// real JSON length, whatever its strings hold.
func TestJSONBound(t *testing.T) {
	status := -1 << 31
	evs := []agent.ProcEvent{
		{},
		{Seq: 1<<64 - 1, Time: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -12*3600)), Kind: agent.ProcExit,
			PID: -1 << 62, PPID: -1 << 62, UID: -1 << 62, ArgvTruncated: true, Status: &status, Duration: -1 << 63,
			Bytes: -1 << 63, Writes: -1 << 62, Lost: 1<<64 - 1, Signal: "SIGTERM"},
		{Kind: agent.ProcExec, Argv: []string{"\x00\x01\n\"\\<>&", "\xff\xfe\xc3", "\u2028\u2029é", strings.Repeat("\x1f", maxArgBytes)},
			Session: "exec:alice:1", Path: "/root/<&>", Addr: "[2001:db8::1]:443", Proto: "tcp", Comm: "\x7f"},
	}
	for i, ev := range evs {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if bound := jsonBound(&ev); bound < len(b)+1 {
			t.Errorf("event %d: bound %d, JSON %d bytes", i, bound, len(b))
		}
	}
}

// TestSessionsKeptLate: a process whose parent has exited keeps the
// session its fork saw (it is init's child by its exec), and a
// connection a new process opens at once carries its session and parent
// (its exec and connect come from two rings, put in order).
func TestSessionsKeptLate(t *testing.T) {
	r := open(t, 0)
	if err := r.WatchConnections(); err != nil {
		t.Fatal(err)
	}
	orphan := exec.Command("/bin/sh", "-c", "(sleep 0.3; exec /bin/echo orphan-marker) & exit 0")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	r.Tag(orphan.Process.Pid, "s-orphan")
	_ = orphan.Wait()
	ev := waitFor(t, r, func(ev agent.ProcEvent) bool {
		return ev.Kind == agent.ProcExec && slices.Contains(ev.Argv, "orphan-marker")
	})
	if ev.Session != "s-orphan" {
		t.Errorf("exec of a process whose parent exited: %+v, want session s-orphan", ev)
	}

	conn := exec.Command("/bin/sh", "-c", "bash -c 'echo x >/dev/udp/192.0.2.77/53'; true")
	if err := conn.Start(); err != nil {
		t.Fatal(err)
	}
	r.Tag(conn.Process.Pid, "s-conn")
	_ = conn.Wait()
	r.Drain()
	var got *agent.ProcEvent
	for _, e := range r.Read(0, 0).Events {
		if e.Kind == agent.ProcConnect && e.Addr == "192.0.2.77:53" {
			got = &e
		}
	}
	if got == nil || got.Session != "s-conn" || got.PPID != conn.Process.Pid {
		t.Errorf("connect of a new process: %+v, want session s-conn and parent %d", got, conn.Process.Pid)
	}
}
