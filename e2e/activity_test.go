package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/denhq/den/api"
)

// activity reads den activity ARGS --json.
func (d *daemon) activity(t *testing.T, args ...string) []api.ActivityEntry {
	t.Helper()
	var out []api.ActivityEntry
	if err := json.Unmarshal([]byte(d.must(append(append([]string{"activity"}, args...), "--json")...)), &out); err != nil {
		t.Fatalf("den activity %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// execOf finds the exec of a command line holding marker, and its exit.
func execOf(es []api.ActivityEntry, marker string) (exec, exit *api.ActivityEntry) {
	for i := range es {
		e := &es[i]
		if e.Kind == "exec" && strings.Contains(strings.Join(e.Argv, " "), marker) && exec == nil {
			exec = e
		}
		if exec != nil && e.Kind == "exit" && e.PID == exec.PID {
			return exec, e
		}
	}
	return exec, nil
}

func vmEventsOf(es []api.ActivityEntry) string {
	var out []string
	for _, e := range es {
		if e.Kind == "vm" {
			out = append(out, e.Event+":"+e.Checkpoint)
		}
	}
	return strings.Join(out, " ")
}

// testActivity runs on box after TestCheckpointRestoreFork's restores
// (cp-1 with startWork; work killed after it, saved as cp-2; restored to
// cp-1, then to cp-2): what ran is in the record with argv, status and
// session; cp-1's record is its own line; reading the record wakes
// nothing, and the record outlives sleep and wake.
func testActivity(t *testing.T, d *daemon) {
	if _, err := d.run("exec", "box", "--", "sh", "-c", "echo activity-marker > /root/act-file; exit 3"); exitCode(err) != 3 {
		t.Fatalf("exec exit 3: %v", err)
	}
	live := d.activity(t, "box")
	ex, exit := execOf(live, "activity-marker")
	if ex == nil || exit == nil {
		t.Fatalf("no exec and exit of the command in the record:\n%s", d.must("activity", "box"))
	}
	if exit.Status == nil || *exit.Status != 3 || ex.Session == "" || exit.Session != ex.Session || ex.UID == nil || *ex.UID != 0 {
		t.Errorf("exec %+v, exit %+v: want status 3, uid 0 and one session", ex, exit)
	}
	var opened *api.ActivityEntry
	for i := range live {
		if live[i].Kind == "session" && live[i].Session == ex.Session {
			opened = &live[i]
		}
	}
	if opened == nil || opened.Via != "den" || opened.Who == "" {
		t.Errorf("the exec's session %q: %+v", ex.Session, opened)
	}
	if got := d.activity(t, "box", "--session", ex.Session); len(got) < 4 {
		t.Errorf("--session %s: %d entries, want its session, exec, file and exit", ex.Session, len(got))
	}
	var file *api.ActivityEntry
	for _, e := range d.activity(t, "box", "--files") {
		if e.Path == "/root/act-file" {
			file = &e
		}
	}
	if file == nil || file.Kind != "file" || file.Bytes != int64(len("activity-marker\n")) || file.Session != ex.Session {
		t.Errorf("the file written: %+v", file)
	}
	for _, want := range []string{"checkpoint:cp-1", "checkpoint:cp-2", "restore:cp-1", "restore:cp-2"} {
		if !strings.Contains(vmEventsOf(live), want) {
			t.Errorf("vm events %q lack %s", vmEventsOf(live), want)
		}
	}
	if e, _ := execOf(live, "kill $(cat /tmp/pid)"); e == nil {
		t.Errorf("the kill after cp-1 is not in the record")
	}

	// cp-1's record: the work started before it, not what came after.
	at1 := d.activity(t, "box@cp-1")
	if e, _ := execOf(at1, "echo v1 > /root/file"); e == nil {
		t.Errorf("box@cp-1 lacks the work started before it:\n%s", d.must("activity", "box@cp-1"))
	}
	if e, _ := execOf(at1, "kill $(cat /tmp/pid)"); e != nil {
		t.Errorf("box@cp-1 holds the kill that came after it")
	}
	if ev := vmEventsOf(at1); !strings.HasSuffix(ev, "checkpoint:cp-1") {
		t.Errorf("box@cp-1 ends with %q", ev)
	}

	// Read while asleep: it stays asleep; after a wake the record goes on.
	d.must("sleep", "box")
	asleep := d.activity(t, "box", "--vm-events", "--last", "1")
	if len(asleep) != 1 || asleep[0].Event != "sleep" || d.info("box").State != "sleeping" {
		t.Errorf("read while asleep: %+v, state %s", asleep, d.info("box").State)
	}
	d.must("exec", "box", "--", "sh", "-c", "echo after-wake")
	woke := d.activity(t, "box")
	if e, _ := execOf(woke, "after-wake"); e == nil || !strings.HasSuffix(vmEventsOf(woke), "sleep: wake:") {
		t.Errorf("after a wake: vm events %q, exec %v", vmEventsOf(woke), e)
	}
	if e, _ := execOf(woke, "activity-marker"); e == nil {
		t.Error("the record lost what came before the sleep")
	}
	// Switched off, nothing is recorded; the switch is.
	d.must("activity", "box", "--record", "off")
	d.must("exec", "box", "--", "sh", "-c", "echo while-off > /root/off-file")
	d.must("activity", "box", "--record", "on")
	d.must("exec", "box", "--", "sh", "-c", "echo back-on")
	after := d.activity(t, "box")
	if e, _ := execOf(after, "while-off"); e != nil {
		t.Errorf("recorded while off: %+v", e)
	}
	if e, _ := execOf(after, "back-on"); e == nil || !strings.Contains(vmEventsOf(after), "record: record:") {
		t.Errorf("after switching back on: exec %v, vm events %q", e, vmEventsOf(after))
	}
	for _, bad := range [][]string{{"activity", "box@cp-99"}, {"activity", "ghost"}, {"activity", "box@cp-1", "--follow"}, {"activity", "box", "--record", "maybe"}} {
		if _, err := d.run(bad...); exitCode(err) == 0 {
			t.Errorf("den %s succeeded", strings.Join(bad, " "))
		}
	}
}
