//go:build linux

package machine_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
)

// TestCheckpointIDsNeverComeBack: after den checkpoint rm of the newest
// checkpoint (the head), the next checkpoint gets a new id, descends from
// the deleted one's parent, and the lineage lists every checkpoint; after
// den rm and a new VM of the same name, ids go on where they were.
func TestCheckpointIDsNeverComeBack(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("box")
	take := func() string {
		t.Helper()
		cp, err := e.m.Checkpoint(ctx, "box", machine.CheckpointOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cp.ID
	}
	lineage := func() (lines []string, head string) {
		t.Helper()
		cps, head, err := e.m.Checkpoints(ctx, "box")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range checkpoint.Tree(cps) {
			lines = append(lines, l.Prefix+l.ID+" <- "+l.Parent)
		}
		return lines, head
	}
	take()
	take()
	if err := e.m.DeleteCheckpoint(ctx, "box", "cp-2"); err != nil {
		t.Fatal(err)
	}
	if _, head := lineage(); head != "cp-1" {
		t.Fatalf("head after deleting the head cp-2: %q, want its parent cp-1", head)
	}
	if id := take(); id != "cp-3" {
		t.Fatalf("the checkpoint after deleting the newest (cp-2) is %s, want cp-3", id)
	}
	take()
	lines, head := lineage()
	want := []string{"cp-1 <- ", "└─ cp-3 <- cp-1", "   └─ cp-4 <- cp-3"}
	if !reflect.DeepEqual(lines, want) || head != "cp-4" {
		t.Fatalf("lineage (head %s):\n%s\nwant (head cp-4):\n%s", head, strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if err := e.m.Remove(ctx, "box", true); err != nil {
		t.Fatal(err)
	}
	e.create("box")
	if id := take(); id != "cp-5" {
		t.Fatalf("the first checkpoint of a new vm box is %s, want cp-5 (the removed box had up to cp-4)", id)
	}
	lines, head = lineage()
	if want := []string{"cp-5 <- "}; !reflect.DeepEqual(lines, want) || head != "cp-5" {
		t.Fatalf("lineage of the new box (head %s):\n%s", head, strings.Join(lines, "\n"))
	}
}
