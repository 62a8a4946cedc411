package api

import (
	"context"
	"net/http"
)

// VerifyRequest asks to check checkpoints against their digests: one
// (Checkpoint), every one (All), or the head when neither is given.
type VerifyRequest struct {
	Checkpoint string `json:"checkpoint,omitempty"`
	All        bool   `json:"all,omitempty"`
}

// Verification is what a verification found in one checkpoint.
type Verification struct {
	Checkpoint string `json:"checkpoint"`
	// Status is "ok", "damaged" or "unsealed" (no digests to check:
	// taken before den kept them, or still being written).
	Status string         `json:"status"`
	Error  string         `json:"error,omitempty"`
	Files  []VerifiedFile `json:"files"`
}

// VerifiedFile is one file of a verified checkpoint.
type VerifiedFile struct {
	File string `json:"file"`
	Size int64  `json:"size"`
	// Extents is how many of its Of extents were checked: read, or
	// known to be holes from the volume's map of the file (Holes of
	// them, checked as zeros); ReadBytes is what was read.
	Extents   int   `json:"extents_read"`
	Of        int   `json:"extents"`
	Holes     int   `json:"holes,omitempty"`
	ReadBytes int64 `json:"read_bytes"`
	// Status is "ok", "damaged", "missing" or "unsealed".
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// VerifyCheckpoints reads checkpoints of a VM against their digests. A
// damaged checkpoint is a result, not an error: see each Status.
func (c *Client) VerifyCheckpoints(ctx context.Context, name string, req VerifyRequest, progress func(Event)) ([]Verification, error) {
	ev, err := c.streamEvent(ctx, http.MethodPost, vmPath(name, "checkpoints", "verify"), req, progress)
	if err != nil {
		return nil, err
	}
	return ev.Verified, nil
}
