package api

import (
	"context"
	"net/url"
	"time"
)

// Trace is the steps of a VM's last operation (create, checkpoint,
// restore, fork, sleep, wake) and how long each took: every millisecond
// above the VMM's own work has a name. Steps may nest and overlap (a
// verification runs beside a VMM's start).
type Trace struct {
	VM      string      `json:"vm"`
	Op      string      `json:"op"`
	Started time.Time   `json:"started"`
	TotalMS float64     `json:"total_ms"`
	Steps   []TraceStep `json:"steps"`
}

// TraceStep is one step: when it began (from the start of the
// operation) and how long it took.
type TraceStep struct {
	Name string  `json:"name"`
	AtMS float64 `json:"at_ms"`
	MS   float64 `json:"ms"`
}

// Trace returns the steps of a VM's last operation.
func (c *Client) Trace(ctx context.Context, name string) (Trace, error) {
	var t Trace
	err := c.do(ctx, "GET", "/v1/vms/"+url.PathEscape(name)+"/trace", nil, &t)
	return t, err
}
