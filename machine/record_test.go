package machine_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/machine"
)

// vmEvents lists a record's VM events as "event[:checkpoint]".
func vmEvents(es []activity.Entry) []string {
	var out []string
	for _, e := range es {
		if e.Kind != activity.KindVM {
			continue
		}
		s := e.Event
		if e.Checkpoint != "" {
			s += ":" + e.Checkpoint
		}
		if e.From != "" {
			s += ":" + e.From
		}
		out = append(out, s)
	}
	return out
}

// TestActivityRecord: what happens to a VM is marked in its record, a
// session with who opened it; a checkpoint's record is its own line; a
// fork's record starts at its origin; a removed VM's record goes with
// it. (The in-process agent records no processes: the record says so
// once.)
func TestActivityRecord(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.m.Sleep(ctx, "a", false))
	must(e.m.Wake(ctx, "a"))
	cp1, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
	must(err)
	s, err := e.m.Open(ctx, "a", "")
	must(err)
	id := s.Tag("alice (unix uid=1000)", "den")
	s.Release()
	if !strings.HasPrefix(id, "den-") {
		t.Errorf("session id %q", id)
	}
	for i := 0; i < 3; i++ {
		u, err := e.m.Open(ctx, "a", "")
		must(err)
		u.NoteURL(8080)
		u.Release()
	}
	urls, _ := e.m.Activity(ctx, "a", activity.Filter{Kinds: []string{activity.KindSession}})
	if n := len(urls); n != 2 || urls[1].Via != "url" || urls[1].Detail != "to port 8080" {
		t.Errorf("three URL requests at once: %+v, want one url entry after the session", urls)
	}
	saved, err := e.m.Restore(ctx, "a", cp1.ID, machine.RestoreOptions{}, nil)
	must(err)

	all, err := e.m.Activity(ctx, "a", activity.Filter{})
	must(err)
	want := []string{"boot", "sleep", "wake", "checkpoint:" + cp1.ID, "checkpoint:" + saved, "restore:" + cp1.ID}
	if got := vmEvents(all); !slices.Equal(got, want) {
		t.Errorf("vm events %q, want %q", got, want)
	}
	sessions, err := e.m.Activity(ctx, "a", activity.Filter{Session: id})
	must(err)
	if len(sessions) != 1 || sessions[0].Who != "alice (unix uid=1000)" || sessions[0].Via != "den" {
		t.Errorf("session entries %+v", sessions)
	}
	lost, _ := e.m.Activity(ctx, "a", activity.Filter{Kinds: []string{activity.KindLost}})
	if len(lost) != 1 || !strings.Contains(lost[0].Detail, "records no processes") {
		t.Errorf("lost entries %+v: want one saying the guest records nothing", lost)
	}

	// cp-1's record ends at its mark; the one saved before the restore
	// holds the session; one taken after the restore does not.
	at1, err := e.m.Activity(ctx, "a", activity.Filter{Checkpoint: cp1.ID})
	must(err)
	if got := vmEvents(at1); !slices.Equal(got, want[:4]) {
		t.Errorf("%s: %q", cp1.ID, got)
	}
	atSaved, _ := e.m.Activity(ctx, "a", activity.Filter{Checkpoint: saved, Session: id})
	if len(atSaved) != 1 {
		t.Errorf("%s (saved before the restore) lacks the session: %+v", saved, atSaved)
	}
	cp3, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
	must(err)
	at3, _ := e.m.Activity(ctx, "a", activity.Filter{Checkpoint: cp3.ID})
	if got := vmEvents(at3); !slices.Equal(got, append(want[:4:4], "restore:"+cp1.ID, "checkpoint:"+cp3.ID)) {
		t.Errorf("%s: %q", cp3.ID, got)
	}
	for _, e := range at3 {
		if e.Session == id {
			t.Errorf("%s holds the session a restore set aside", cp3.ID)
		}
	}
	if _, err := e.m.Activity(ctx, "a", activity.Filter{Checkpoint: "cp-99"}); err == nil {
		t.Error("the record of an unknown checkpoint was read")
	}

	_, err = e.m.Fork(ctx, "a", cp1.ID, "b", nil)
	must(err)
	fb, err := e.m.Activity(ctx, "b", activity.Filter{})
	must(err)
	if got := vmEvents(fb); len(got) == 0 || got[0] != "fork:a@"+cp1.ID {
		t.Errorf("fork's vm events %q", got)
	}

	must(e.m.Remove(ctx, "a", true))
	if _, err := e.m.Activity(ctx, "a", activity.Filter{}); err == nil {
		t.Error("a removed VM's record was read")
	}
	e.create("a")
	again, err := e.m.Activity(ctx, "a", activity.Filter{})
	must(err)
	if got := vmEvents(again); !slices.Equal(got, []string{"boot"}) || again[0].N != 1 {
		t.Errorf("a new VM of the same name: %q (first entry %d)", got, again[0].N)
	}
}
