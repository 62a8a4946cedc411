package checkpoint

import (
	"sort"
)

// Line is one row of a lineage tree: the checkpoint and the tree drawing
// that goes before it.
type Line struct {
	Prefix string
	Record
}

// Tree orders checkpoints as a lineage tree (children under their parent,
// oldest first) with box-drawing prefixes. A checkpoint whose parent is
// unknown, or itself, is a root; every checkpoint is listed once, even
// where a damaged catalog's parents make a loop (its oldest member is
// then a root).
func Tree(cps []Record) []Line {
	byID := map[string]bool{}
	for _, c := range cps {
		byID[c.ID] = true
	}
	children := map[string][]Record{}
	for _, c := range cps {
		parent := c.Parent
		if !byID[parent] || parent == c.ID {
			parent = ""
		}
		children[parent] = append(children[parent], c)
	}
	for _, cs := range children {
		sort.Slice(cs, func(i, j int) bool { return cs[i].Seq < cs[j].Seq })
	}
	var out []Line
	listed := map[string]bool{}
	var walk func(cs []Record, indent string, root bool)
	walk = func(cs []Record, indent string, root bool) {
		var todo []Record
		for _, c := range cs {
			if !listed[c.ID] {
				todo = append(todo, c)
				listed[c.ID] = true
			}
		}
		for i, c := range todo {
			last := i == len(todo)-1
			prefix, next := "", ""
			if !root {
				prefix, next = indent+"├─ ", indent+"│  "
				if last {
					prefix, next = indent+"└─ ", indent+"   "
				}
			}
			out = append(out, Line{Prefix: prefix, Record: c})
			walk(children[c.ID], next, false)
		}
	}
	walk(children[""], "", true)
	if len(listed) < len(byID) { // a loop: no root leads to it
		rest := append([]Record(nil), cps...)
		sort.Slice(rest, func(i, j int) bool { return rest[i].Seq < rest[j].Seq })
		for _, c := range rest {
			if !listed[c.ID] {
				walk([]Record{c}, "", true)
			}
		}
	}
	return out
}

// Prune chooses what a retention of keep checkpoints deletes: the oldest
// ones beyond the newest keep, never one in protect (the VM's head).
func Prune(cps []Record, keep int, protect map[string]bool) []string {
	if keep < 0 || len(cps) <= keep {
		return nil
	}
	sorted := append([]Record(nil), cps...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Seq > sorted[j].Seq })
	var out []string
	for _, c := range sorted[keep:] {
		if !protect[c.ID] {
			out = append(out, c.ID)
		}
	}
	return out
}
