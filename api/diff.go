package api

import (
	"context"
	"net/http"
	"time"
)

// DiffRequest asks what changed on disk between a checkpoint of the VM
// named in the path (From) and a checkpoint of ToVM (the same VM when
// empty), or ToVM's current state when To is empty: a disk-only
// checkpoint of it is taken first.
type DiffRequest struct {
	From  string `json:"from"`
	ToVM  string `json:"to_vm,omitempty"`
	To    string `json:"to,omitempty"`
	Path  string `json:"path,omitempty"`
	Patch bool   `json:"patch,omitempty"`
}

// Diff is the files added, removed and changed between two checkpoints'
// disks, in path order.
type Diff struct {
	FromVM string `json:"from_vm"`
	From   string `json:"from"`
	ToVM   string `json:"to_vm"`
	To     string `json:"to"`
	// Taken says To is a disk-only checkpoint taken for this diff: the
	// current state.
	Taken   bool         `json:"taken,omitempty"`
	Path    string       `json:"path"`
	Changes []DiffChange `json:"changes"`
	Summary DiffSummary  `json:"summary"`
}

// DiffChange is one path added, removed or changed.
type DiffChange struct {
	Path string `json:"path"`
	// Op is added, removed or changed.
	Op  string    `json:"op"`
	Old *DiffFile `json:"old,omitempty"`
	New *DiffFile `json:"new,omitempty"`
	// What changed of a path on both sides: type, content, mode, owner,
	// target (a symlink's), device.
	What      []string `json:"what,omitempty"`
	LinkOf    string   `json:"link_of,omitempty"`
	MovedFrom string   `json:"moved_from,omitempty"`
	Binary    bool     `json:"binary,omitempty"`
	Patch     string   `json:"patch,omitempty"`
	NoPatch   string   `json:"no_patch,omitempty"`
}

// DiffFile is a path's inode on one side of a diff.
type DiffFile struct {
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   string    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Target string    `json:"target,omitempty"`
	Links  uint64    `json:"links"`
	MTime  time.Time `json:"mtime"`
}

// DiffSummary counts a diff's changes; bytes are regular files' (the
// changed ones' growth, negative when they shrank).
type DiffSummary struct {
	Added        int   `json:"added"`
	Removed      int   `json:"removed"`
	Changed      int   `json:"changed"`
	AddedBytes   int64 `json:"added_bytes"`
	RemovedBytes int64 `json:"removed_bytes"`
	ChangedBytes int64 `json:"changed_bytes"`
}

// Diff compares a checkpoint of VM name with another checkpoint or a
// current state (see DiffRequest), streaming progress.
func (c *Client) Diff(ctx context.Context, name string, req DiffRequest, progress func(Event)) (*Diff, error) {
	ev, err := c.streamEvent(ctx, http.MethodPost, vmPath(name, "diff"), req, progress)
	if err != nil {
		return nil, err
	}
	return ev.Diff, nil
}
