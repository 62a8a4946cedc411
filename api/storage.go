package api

import (
	"context"
	"net/http"
)

// What snapshots' memory takes in the volume's memory store, and the
// store's collection:
//
//	GET  /v1/storage  -> Storage (the caller's VMs; an admin's: every VM)
//	POST /v1/host/gc  GCRequest -> GCResult (admins only: 403 otherwise)

// Usage is what a VM's (or the warm bases') memory snapshots name in the
// store: Referenced bytes, of which Unique only they name (what deleting
// them frees) and Shared others name too.
type Usage struct {
	Referenced int64 `json:"referenced_bytes"`
	Unique     int64 `json:"unique_bytes"`
	Shared     int64 `json:"shared_bytes"`
}

// Storage is the memory store's totals and each VM's use.
type Storage struct {
	// Stored is the size of every pack in the store; Live the part some
	// snapshot names; Garbage the rest, which a collection frees.
	Stored  int64       `json:"stored_bytes"`
	Live    int64       `json:"live_bytes"`
	Garbage int64       `json:"garbage_bytes"`
	Packs   int         `json:"packs"`
	VMs     []VMStorage `json:"vms"`
	Bases   Usage       `json:"bases"`
	// Disk is the data every disk file on the volume references (VMs',
	// checkpoints', images', spares'), each shared piece counted once.
	Disk int64 `json:"disk_bytes"`
}

// VMStorage is one VM's memory in the store, and each checkpoint's.
type VMStorage struct {
	Name       string `json:"name"`
	Referenced int64  `json:"referenced_bytes"`
	Unique     int64  `json:"unique_bytes"`
	Shared     int64  `json:"shared_bytes"`
	// Disk is what its disks (its own and its checkpoints') reference,
	// hold alone and share (with forks, its image, each other).
	Disk        Usage               `json:"disk"`
	Checkpoints []CheckpointStorage `json:"checkpoints,omitempty"`
}

// CheckpointStorage is one checkpoint's memory: what it names, and what
// deleting it frees.
type CheckpointStorage struct {
	ID         string `json:"id"`
	Referenced int64  `json:"referenced_bytes"`
	Frees      int64  `json:"frees_bytes"`
	// DiskFrees is the disk data only this checkpoint holds.
	DiskFrees int64 `json:"disk_frees_bytes"`
}

// GCRequest asks for a collection of the memory store.
type GCRequest struct {
	// DryRun only says what would go.
	DryRun bool `json:"dry_run,omitempty"`
}

// GCResult says what a collection found and removed.
type GCResult struct {
	Manifests int      `json:"manifests"`
	Packs     int      `json:"packs"`
	Garbage   []string `json:"garbage"`
	Bytes     int64    `json:"bytes"`
	// Repacked are packs mostly dead whose live extents (MovedBytes)
	// went into a new pack; FreedBytes the dead part that went with
	// them.
	Repacked  []string `json:"repacked"`
	Moved     int64    `json:"moved_bytes"`
	Freed     int64    `json:"freed_bytes"`
	Young     int      `json:"young"`
	Removed   int      `json:"removed"`
	Temporary int      `json:"temporary"`
	DryRun    bool     `json:"dry_run"`
}

// Storage reports what snapshots' memory takes in the memory store.
func (c *Client) Storage(ctx context.Context) (Storage, error) {
	var s Storage
	err := c.do(ctx, http.MethodGet, "/v1/storage", nil, &s)
	return s, err
}

// CollectGarbage collects the memory store (an admin's call).
func (c *Client) CollectGarbage(ctx context.Context, req GCRequest) (GCResult, error) {
	var r GCResult
	err := c.do(ctx, http.MethodPost, "/v1/host/gc", req, &r)
	return r, err
}
