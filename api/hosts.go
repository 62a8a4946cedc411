package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Host is a daemon that keeps its record in den's registry (GET
// /v1/hosts): one on a single host, every host of a cluster.
type Host struct {
	Name    string `json:"name"`
	Address string `json:"address,omitempty"`
	Version string `json:"version"`
	VMM     string `json:"vmm"`
	// CPUModel is the host CPU's model name; CPUs its count.
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
	// MemoryBudgetBytes is the guest memory the host commits at most (-1:
	// no budget); MemoryFreeBytes what is left of it.
	MemoryBudgetBytes int64 `json:"memory_budget_bytes"`
	MemoryFreeBytes   int64 `json:"memory_free_bytes"`
	// Running and Sleeping count its VMs at its last heartbeat.
	Running  int  `json:"running"`
	Sleeping int  `json:"sleeping"`
	Draining bool `json:"draining,omitempty"`
	// StartedAt is when its daemon started; Heartbeat its last
	// heartbeat, by the registry database's clock.
	StartedAt time.Time `json:"started_at"`
	Heartbeat time.Time `json:"heartbeat"`
	// HeartbeatAgeMS is how long ago that was, by the same clock; Alive
	// says whether that is within the lease (HostList.LeaseMS).
	HeartbeatAgeMS int64 `json:"heartbeat_age_ms"`
	Alive          bool  `json:"alive"`
	// This marks the host that answered.
	This bool `json:"this,omitempty"`
}

// HostList is the hosts sharing the registry (GET /v1/hosts).
type HostList struct {
	Hosts []Host `json:"hosts"`
	// Registry is the registry's backend: sqlite or postgres.
	Registry string `json:"registry"`
	// LeaseMS is the lease: a host whose heartbeat is older is not
	// alive.
	LeaseMS int64 `json:"lease_ms"`
}

// Hosts lists the hosts sharing the daemon's registry.
func (c *Client) Hosts(ctx context.Context) (HostList, error) {
	var l HostList
	err := c.do(ctx, http.MethodGet, "/v1/hosts", nil, &l)
	return l, err
}

// MoveRequest moves a VM to another host of a cluster (POST
// /v1/vms/NAME/move): put to sleep where it runs, woken on To.
type MoveRequest struct {
	To string `json:"to"`
	// Force puts it to sleep with sessions open (they end).
	Force bool `json:"force,omitempty"`
}

// MoveResult is a move done: where from ("" when it ran nowhere) and
// to, and what each step took.
type MoveResult struct {
	VM      VM     `json:"vm"`
	From    string `json:"from,omitempty"`
	To      string `json:"to"`
	SleepMS int64  `json:"sleep_ms"`
	WakeMS  int64  `json:"wake_ms"`
	TotalMS int64  `json:"total_ms"`
}

// Move moves a VM to another host of the cluster.
func (c *Client) Move(ctx context.Context, name string, req MoveRequest) (MoveResult, error) {
	var res MoveResult
	err := c.do(ctx, http.MethodPost, vmPath(name, "move"), req, &res)
	return res, err
}

// DrainRequest drains a host (POST /v1/hosts/NAME/drain): it admits no
// new VMs, and its running VMs move to other hosts.
type DrainRequest struct {
	// Undo admits VMs on the host again.
	Undo bool `json:"undo,omitempty"`
	// Force moves VMs with sessions open (they end).
	Force bool `json:"force,omitempty"`
}

// DrainResult is a drain done: the VMs moved, and those that could not
// be, with why.
type DrainResult struct {
	Host     string         `json:"host"`
	Draining bool           `json:"draining"`
	Moved    []MoveResult   `json:"moved"`
	Failed   []DrainFailure `json:"failed"`
}

// DrainFailure is a VM a drain could not move.
type DrainFailure struct {
	VM    string `json:"vm"`
	Error string `json:"error"`
}

// Drain drains a host of the cluster (or admits VMs on it again, with
// req.Undo).
func (c *Client) Drain(ctx context.Context, host string, req DrainRequest) (DrainResult, error) {
	var res DrainResult
	err := c.do(ctx, http.MethodPost, "/v1/hosts/"+url.PathEscape(host)+"/drain", req, &res)
	return res, err
}
