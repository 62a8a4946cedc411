package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// The host's life: every VM put to sleep before the host shuts down, and
// woken after. Both endpoints are root's (a request with OwnerHeader is
// refused with 403): they act on every user's VMs.
//
//	POST /v1/host/sleep  HostSleepRequest -> stream of HostEvent
//	POST /v1/host/wake   HostWakeRequest  -> stream of HostEvent
//
// A bad request is answered 400 with an ErrorBody before any work. Then
// the answer (200, application/x-ndjson) is one HostEvent per line: one
// with Result per VM as it is done, then a final one (Done) with the
// Summary, or with Error and Code if the operation could not run at all.
// VMs that failed are in the Summary's Failed; the operation itself
// still succeeded.

// HostSleepRequest asks for every running VM to be put to sleep.
type HostSleepRequest struct {
	// Shutdown says the host is going down: the VMs put to sleep are
	// marked so that the daemon wakes them when it next starts; a VM that
	// cannot sleep within Timeout is stopped and recorded with what was
	// lost; sessions do not hold a VM awake; and the daemon then refuses
	// new work until it restarts.
	Shutdown bool `json:"shutdown,omitempty"`
	// Timeout bounds the whole operation, a Go duration ("2m"); empty
	// takes the daemon's default (2m).
	Timeout string `json:"timeout,omitempty"`
	// Parallel is how many VMs are put to sleep at once (0: 4).
	Parallel int `json:"parallel,omitempty"`
	// Force puts VMs with sessions open to sleep too.
	Force bool `json:"force,omitempty"`
}

// HostWakeRequest asks for every sleeping VM to be woken, the most
// recently active first.
type HostWakeRequest struct {
	// Timeout bounds the whole operation, a Go duration; empty: 2m.
	Timeout string `json:"timeout,omitempty"`
	// Parallel is how many VMs are woken at once (0: 4).
	Parallel int `json:"parallel,omitempty"`
}

// HostVM is what became of one VM.
type HostVM struct {
	Name string `json:"name"`
	// OK: the VM was put to sleep (woken), or already was.
	OK bool `json:"ok"`
	// State and Reason are the VM's record afterwards.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	TookMS int64  `json:"took_ms"`
	// Error and Code say why not, when not OK.
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
}

// HostSummary is the final result: every VM's outcome, and the names of
// those that failed.
type HostSummary struct {
	VMs    []HostVM `json:"vms"`
	Failed []string `json:"failed"`
	TookMS int64    `json:"took_ms"`
}

// HostEvent is one line of the answer of POST /v1/host/sleep or wake.
type HostEvent struct {
	Result  *HostVM      `json:"result,omitempty"`
	Summary *HostSummary `json:"summary,omitempty"`
	Error   string       `json:"error,omitempty"`
	Code    string       `json:"code,omitempty"`
	// Done marks the final line.
	Done    bool   `json:"done,omitempty"`
	Elapsed string `json:"elapsed,omitempty"`
}

// SleepAll puts every running VM to sleep; progress (if not nil) gets
// each VM's outcome as it comes. VMs that could not be put to sleep are
// in the summary's Failed, not an error.
func (c *Client) SleepAll(ctx context.Context, req HostSleepRequest, progress func(HostVM)) (HostSummary, error) {
	return c.hostStream(ctx, "/v1/host/sleep", req, progress)
}

// WakeAll wakes every sleeping VM; see SleepAll.
func (c *Client) WakeAll(ctx context.Context, req HostWakeRequest, progress func(HostVM)) (HostSummary, error) {
	return c.hostStream(ctx, "/v1/host/wake", req, progress)
}

func (c *Client) hostStream(ctx context.Context, path string, in any, progress func(HostVM)) (HostSummary, error) {
	resp, err := c.send(ctx, http.MethodPost, path, in)
	if err != nil {
		return HostSummary{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var ev HostEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return HostSummary{}, fmt.Errorf("POST %s: bad event from the daemon: %w", path, err)
		}
		switch {
		case ev.Error != "":
			status := http.StatusInternalServerError
			if c, ok := Codes[ev.Code]; ok {
				status = c.Status
			}
			return HostSummary{}, &Error{Status: status, Code: ev.Code, Message: ev.Error}
		case ev.Summary != nil:
			return *ev.Summary, nil
		case ev.Result != nil && progress != nil:
			progress(*ev.Result)
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return HostSummary{}, fmt.Errorf("POST %s: %w (the operation goes on in the daemon)", path, ctx.Err())
		}
		return HostSummary{}, fmt.Errorf("POST %s: the daemon's answer broke off before its summary: %w: %w", path, err, ErrDaemon)
	}
	return HostSummary{}, fmt.Errorf("POST %s: the daemon's answer ended before its summary (see den ls): %w", path, ErrDaemon)
}
