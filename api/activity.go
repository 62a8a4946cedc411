package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ActivityEntry is one entry of a VM's activity record (GET
// /v1/vms/{name}/activity): a guest process started (exec) or ended
// (exit), a file it wrote (file), a connection it opened (connect), a use
// of one of den's secrets (secret), a den
// session opened (session), something that happened to the VM (vm), or
// events den could not read (lost).
type ActivityEntry struct {
	N             uint64        `json:"n"`
	Time          time.Time     `json:"time"`
	Kind          string        `json:"kind"`
	PID           int           `json:"pid,omitempty"`
	PPID          int           `json:"ppid,omitempty"`
	UID           *int          `json:"uid,omitempty"`
	Argv          []string      `json:"argv,omitempty"`
	ArgvTruncated bool          `json:"argv_truncated,omitempty"`
	Status        *int          `json:"status,omitempty"`
	Signal        string        `json:"signal,omitempty"`
	Duration      time.Duration `json:"duration_ns,omitempty"`
	Path          string        `json:"path,omitempty"`
	Bytes         int64         `json:"bytes,omitempty"`
	Writes        int           `json:"writes,omitempty"`
	Addr          string        `json:"addr,omitempty"`
	Proto         string        `json:"proto,omitempty"`
	Name          string        `json:"name,omitempty"`
	Comm          string        `json:"comm,omitempty"`
	Secret        string        `json:"secret,omitempty"`
	Session       string        `json:"session,omitempty"`
	Who           string        `json:"who,omitempty"`
	Via           string        `json:"via,omitempty"`
	Event         string        `json:"event,omitempty"`
	Checkpoint    string        `json:"checkpoint,omitempty"`
	From          string        `json:"from,omitempty"`
	Detail        string        `json:"detail,omitempty"`
	Lost          uint64        `json:"lost,omitempty"`
}

// ActivityRecordRequest switches a running VM's guest record on or off
// (POST /v1/vms/{name}/activity/record); the answer says where it stands.
type ActivityRecordRequest struct {
	On bool `json:"on"`
}

// SetActivityRecord switches a running VM's guest record of processes
// and files on or off, until its next boot.
func (c *Client) SetActivityRecord(ctx context.Context, name string, on bool) (bool, error) {
	var out ActivityRecordRequest
	err := c.do(ctx, http.MethodPost, vmPath(name, "activity", "record"), ActivityRecordRequest{On: on}, &out)
	return out.On, err
}

// ActivityQuery chooses entries of a VM's activity record; zero fields
// choose all.
type ActivityQuery struct {
	Checkpoint   string
	Since, Until time.Time
	Kinds        []string
	Session      string
	After        uint64
	Last         int
}

// Activity reads a VM's activity record (GET /v1/vms/{name}/activity),
// oldest first.
func (c *Client) Activity(ctx context.Context, name string, q ActivityQuery) ([]ActivityEntry, error) {
	v := url.Values{}
	if q.Checkpoint != "" {
		v.Set("checkpoint", q.Checkpoint)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if len(q.Kinds) > 0 {
		v.Set("kind", strings.Join(q.Kinds, ","))
	}
	if q.Session != "" {
		v.Set("session", q.Session)
	}
	if q.After > 0 {
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	if q.Last > 0 {
		v.Set("last", strconv.Itoa(q.Last))
	}
	path := vmPath(name, "activity")
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out []ActivityEntry
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}
