package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Checkpoint is a saved instant of a VM.
type Checkpoint struct {
	VM          string    `json:"vm"`
	ID          string    `json:"id"`
	Parent      string    `json:"parent,omitempty"`
	Kind        string    `json:"kind"` // memory+disk or disk-only
	Comment     string    `json:"comment,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	MemoryBytes int64     `json:"memory_bytes"`
	DiskBytes   int64     `json:"disk_bytes"`
	// Head marks the checkpoint the VM's current state descends from.
	Head bool `json:"head,omitempty"`
	// Damaged says why the checkpoint failed verification, when it did.
	Damaged string `json:"damaged,omitempty"`
	// Depth and Tree draw the lineage: Tree is the box-drawing prefix.
	Depth int    `json:"depth"`
	Tree  string `json:"tree,omitempty"`
}

// CheckpointRequest asks for a checkpoint.
type CheckpointRequest struct {
	Comment  string `json:"comment,omitempty"`
	DiskOnly bool   `json:"disk_only,omitempty"`
	// Keep, when > 0, keeps only the newest Keep checkpoints afterwards.
	Keep int `json:"keep,omitempty"`
}

// RestoreRequest asks to bring a VM back to a checkpoint.
type RestoreRequest struct {
	Checkpoint string `json:"checkpoint"`
	NoSave     bool   `json:"no_save,omitempty"`
	Force      bool   `json:"force,omitempty"`
}

// ForkRequest asks for a new VM from a checkpoint (the source's current
// state when Checkpoint is empty).
type ForkRequest struct {
	Checkpoint string `json:"checkpoint,omitempty"`
	Name       string `json:"name"`
	// WithSecrets gives the fork the source's grants of den's secrets
	// (a fork has none otherwise).
	WithSecrets bool `json:"with_secrets,omitempty"`
}

// SleepRequest asks a VM to sleep.
type SleepRequest struct {
	Force bool `json:"force,omitempty"`
}

func vmPath(name string, rest ...string) string {
	p := "/v1/vms/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// Checkpoint takes a checkpoint of a VM.
func (c *Client) Checkpoint(ctx context.Context, name string, req CheckpointRequest, progress func(Event)) (Checkpoint, error) {
	ev, err := c.streamEvent(ctx, http.MethodPost, vmPath(name, "checkpoints"), req, progress)
	if err != nil {
		return Checkpoint{}, err
	}
	if ev.Checkpoint == nil {
		return Checkpoint{}, &Error{Code: "internal", Message: "daemon answered without a checkpoint"}
	}
	return *ev.Checkpoint, nil
}

// Checkpoints lists a VM's checkpoints in lineage order.
func (c *Client) Checkpoints(ctx context.Context, name string) ([]Checkpoint, error) {
	var cps []Checkpoint
	err := c.do(ctx, http.MethodGet, vmPath(name, "checkpoints"), nil, &cps)
	return cps, err
}

// DeleteCheckpoint deletes a checkpoint.
func (c *Client) DeleteCheckpoint(ctx context.Context, name, id string) error {
	return c.do(ctx, http.MethodDelete, vmPath(name, "checkpoints", id), nil, nil)
}

// Restore brings a VM back to a checkpoint.
func (c *Client) Restore(ctx context.Context, name string, req RestoreRequest, progress func(Event)) (Restored, error) {
	ev, err := c.streamEvent(ctx, http.MethodPost, vmPath(name, "restore"), req, progress)
	if err != nil {
		return Restored{}, err
	}
	if ev.VM == nil {
		return Restored{}, &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "POST " + vmPath(name, "restore") + ": the daemon's final answer has no vm"}
	}
	return Restored{VM: *ev.VM, Saved: ev.Saved}, nil
}

// Restored is a restore's result: the VM, and the checkpoint that holds
// its state from before the restore ("" with NoSave).
type Restored struct {
	VM
	Saved string `json:"saved,omitempty"`
}

// Fork makes a new VM from a checkpoint of name.
func (c *Client) Fork(ctx context.Context, name string, req ForkRequest, progress func(Event)) (VM, error) {
	return c.stream(ctx, http.MethodPost, vmPath(name, "fork"), req, progress)
}

// Sleep saves a VM's memory and stops its VMM.
func (c *Client) Sleep(ctx context.Context, name string, req SleepRequest) (VM, error) {
	var vm VM
	err := c.do(ctx, http.MethodPost, vmPath(name, "sleep"), req, &vm)
	return vm, err
}

// Wake brings a sleeping (or stopped, or lost) VM back.
func (c *Client) Wake(ctx context.Context, name string) (VM, error) {
	var vm VM
	err := c.do(ctx, http.MethodPost, vmPath(name, "wake"), struct{}{}, &vm)
	return vm, err
}
