package api

import (
	"context"
	"net/http"
)

// RestorePathsRequest asks to put paths of a running VM back as a
// checkpoint holds them, leaving the rest alone.
type RestorePathsRequest struct {
	Checkpoint string `json:"checkpoint"`
	// Paths are absolute guest paths (not /), each with what is under it.
	Paths []string `json:"paths"`
}

// PathAction is one thing a paths restore did to a guest path: restored
// (made again), removed (not in the checkpoint), rewritten (content),
// relinked (a symlink's target), chmod, chown, or skipped (Why says).
type PathAction struct {
	Path string `json:"path"`
	Did  string `json:"did"`
	Why  string `json:"why,omitempty"`
}

// PathsRestored is a paths restore's result: what it did, and the
// disk-only checkpoint taken before it, which holds the state it
// changed.
type PathsRestored struct {
	Saved   string       `json:"saved"`
	Actions []PathAction `json:"actions"`
}

// MaxRestorePaths bounds the paths one request names.
const MaxRestorePaths = 64

// RestorePaths puts paths of a VM back from a checkpoint, streaming
// progress.
func (c *Client) RestorePaths(ctx context.Context, name string, req RestorePathsRequest, progress func(Event)) (PathsRestored, error) {
	ev, err := c.streamEvent(ctx, http.MethodPost, vmPath(name, "restore-paths"), req, progress)
	if err != nil {
		return PathsRestored{}, err
	}
	if ev.PathsRestored == nil {
		return PathsRestored{}, &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "POST " + vmPath(name, "restore-paths") + ": the daemon's final answer has no result"}
	}
	return *ev.PathsRestored, nil
}
