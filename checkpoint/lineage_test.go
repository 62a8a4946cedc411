package checkpoint

import (
	"reflect"
	"strings"
	"testing"
)

func TestTreeAndPrune(t *testing.T) {
	cps := []Record{
		{ID: "cp-1", Seq: 1},
		{ID: "cp-2", Seq: 2, Parent: "cp-1"},
		{ID: "cp-3", Seq: 3, Parent: "cp-2"},
		{ID: "cp-4", Seq: 4, Parent: "cp-1"}, // restored to cp-1, then checkpointed
		{ID: "cp-5", Seq: 5, Parent: "cp-gone"},
	}
	var got []string
	for _, l := range Tree(cps) {
		got = append(got, l.Prefix+l.ID)
	}
	want := []string{"cp-1", "├─ cp-2", "│  └─ cp-3", "└─ cp-4", "cp-5"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if p := Prune(cps, 2, map[string]bool{"cp-1": true}); !reflect.DeepEqual(p, []string{"cp-3", "cp-2"}) {
		t.Fatalf("prune keep 2: %v", p)
	}
	if p := Prune(cps, 10, nil); p != nil {
		t.Fatalf("prune keep 10: %v", p)
	}
}

// TestTreeListsEverything: a catalog damaged by a reused id (a
// checkpoint recorded as its own parent, its descendants under it) or
// by a loop of parents still lists every checkpoint, once.
func TestTreeListsEverything(t *testing.T) {
	for _, c := range []struct {
		cps  []Record
		want []string
	}{{
		cps: []Record{
			{ID: "cp-1", Seq: 1},
			{ID: "cp-2", Seq: 2, Parent: "cp-2"},
			{ID: "cp-3", Seq: 3, Parent: "cp-2"},
			{ID: "cp-4", Seq: 4, Parent: "cp-3"},
		},
		want: []string{"cp-1", "cp-2", "└─ cp-3", "   └─ cp-4"},
	}, {
		cps: []Record{
			{ID: "cp-1", Seq: 1},
			{ID: "cp-2", Seq: 2, Parent: "cp-3"},
			{ID: "cp-3", Seq: 3, Parent: "cp-2"},
		},
		want: []string{"cp-1", "cp-2", "└─ cp-3"},
	}} {
		var got []string
		for _, l := range Tree(c.cps) {
			got = append(got, l.Prefix+l.ID)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}

func TestValidateID(t *testing.T) {
	for _, ok := range []string{"cp-1", "cp-42"} {
		if err := ValidateID(ok); err != nil {
			t.Error(err)
		}
	}
	for _, bad := range []string{"", "cp-0", "cp-", "../cp-1", "cp-1/x", "tmp-cp-1"} {
		if ValidateID(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
