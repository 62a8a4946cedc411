package api

import (
	"context"
	"net/http"
	"time"
)

// A VM's checkpoint schedule:
//
//	GET  /v1/vms/{name}/schedule  -> ScheduleInfo
//	POST /v1/vms/{name}/schedule  ScheduleRequest -> ScheduleInfo

// ScheduleRequest sets a VM's checkpoint schedule, or (Off) removes it.
type ScheduleRequest struct {
	// Every is the interval, a Go duration ("10m"), at least 1s.
	Every string `json:"every,omitempty"`
	// Keep is how many of the newest scheduled checkpoints are kept;
	// KeepDaily how many days keep their newest one too.
	Keep      int  `json:"keep,omitempty"`
	KeepDaily int  `json:"keep_daily,omitempty"`
	DiskOnly  bool `json:"disk_only,omitempty"`
	Off       bool `json:"off,omitempty"`
}

// Schedule is a VM's checkpoint schedule.
type Schedule struct {
	Every     string `json:"every"`
	Keep      int    `json:"keep"`
	KeepDaily int    `json:"keep_daily"`
	DiskOnly  bool   `json:"disk_only"`
	// Taken are the checkpoints it took and keeps, oldest first; Last
	// is when it last took one.
	Taken []string  `json:"taken"`
	Last  time.Time `json:"last"`
}

// ScheduleInfo is a VM's schedule (absent: none).
type ScheduleInfo struct {
	Name     string    `json:"name"`
	Schedule *Schedule `json:"schedule,omitempty"`
}

// Schedule reads a VM's checkpoint schedule.
func (c *Client) Schedule(ctx context.Context, name string) (ScheduleInfo, error) {
	var s ScheduleInfo
	err := c.do(ctx, http.MethodGet, vmPath(name, "schedule"), nil, &s)
	return s, err
}

// SetSchedule sets or removes a VM's checkpoint schedule.
func (c *Client) SetSchedule(ctx context.Context, name string, req ScheduleRequest) (ScheduleInfo, error) {
	var s ScheduleInfo
	err := c.do(ctx, http.MethodPost, vmPath(name, "schedule"), req, &s)
	return s, err
}
