package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// AuditRecord is one line of the audit log: an API call or a gateway
// session.
type AuditRecord struct {
	Time       time.Time `json:"time"`
	User       string    `json:"user"`
	Admin      bool      `json:"admin,omitempty"`
	Source     string    `json:"source"`
	Verb       string    `json:"verb"`
	VM         string    `json:"vm,omitempty"`
	Result     string    `json:"result"`
	Status     int       `json:"status,omitempty"`
	DurationMS float64   `json:"duration_ms"`
}

// AuditQuery selects audit records; zero fields select all.
type AuditQuery struct {
	VM    string
	User  string // an admin's filter; others see only their own
	Since time.Time
	Limit int
}

// Audit reads the audit log (GET /v1/audit): every user's records for an
// admin, the caller's own for anyone else, oldest first.
func (c *Client) Audit(ctx context.Context, q AuditQuery) ([]AuditRecord, error) {
	v := url.Values{}
	if q.VM != "" {
		v.Set("vm", q.VM)
	}
	if q.User != "" {
		v.Set("user", q.User)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/v1/audit"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var recs []AuditRecord
	err := c.do(ctx, http.MethodGet, path, nil, &recs)
	return recs, err
}
