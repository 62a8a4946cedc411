//go:build linux

package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/denhq/den/agent"
)

// Leases are the keep-awake leases taken inside the guest.
type Leases struct {
	mu sync.Mutex
	m  map[string]time.Time // zero: until released
}

// NewLeases returns an empty set.
func NewLeases() *Leases { return &Leases{m: map[string]time.Time{}} }

// Hold takes or renews the lease name for d (0: until released).
func (l *Leases) Hold(name string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var until time.Time
	if d > 0 {
		until = time.Now().Add(d)
	}
	l.m[name] = until
}

// Release drops the lease name and reports whether it was held.
func (l *Leases) Release(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[name]
	delete(l.m, name)
	return ok
}

// List returns the leases in force, by name, dropping expired ones.
func (l *Leases) List() []agent.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var out []agent.Lease
	for n, u := range l.m {
		if !u.IsZero() && !u.After(now) {
			delete(l.m, n)
			continue
		}
		out = append(out, agent.Lease{Name: n, Until: u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ListenLeases opens the lease socket at path (replacing a stale one),
// usable by every guest user.
func ListenLeases(path string) (net.Listener, error) {
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("lease socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("lease socket: %w", err)
	}
	return l, nil
}

// ServeLeases answers lease requests on l until l is closed.
func (l *Leases) ServeLeases(ln net.Listener, log *slog.Logger) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("lease socket: %w", err)
		}
		go l.serveLeaseConn(c, log)
	}
}

func (l *Leases) serveLeaseConn(c net.Conn, log *slog.Logger) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var req agent.LeaseRequest
	var rep agent.LeaseReply
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err == nil || len(line) > 0 {
		err = json.Unmarshal(line, &req)
	}
	switch {
	case err != nil:
		rep.Error = "bad request: " + err.Error()
	case req.Op == "hold":
		name := req.Name
		if name == "" {
			name = "default"
		}
		l.Hold(name, time.Duration(req.ForMS)*time.Millisecond)
		log.Info("keep-awake lease held", "name", name, "for", time.Duration(req.ForMS)*time.Millisecond)
	case req.Op == "release":
		name := req.Name
		if name == "" {
			name = "default"
		}
		if !l.Release(name) {
			rep.Error = fmt.Sprintf("no lease %q", name)
		} else {
			log.Info("keep-awake lease released", "name", name)
		}
	case req.Op == "list":
	default:
		rep.Error = fmt.Sprintf("unknown op %q", req.Op)
	}
	rep.Leases = l.List()
	data, _ := json.Marshal(rep)
	c.Write(append(data, '\n'))
}

// LeaseCall sends one request to the agent's lease socket (den-agent hold,
// release and status use it).
func LeaseCall(ctx context.Context, path string, req agent.LeaseRequest) (agent.LeaseReply, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return agent.LeaseReply{}, fmt.Errorf("lease %s: %w", req.Op, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	data, _ := json.Marshal(req)
	if _, err := c.Write(append(data, '\n')); err != nil {
		return agent.LeaseReply{}, fmt.Errorf("lease %s: %w", req.Op, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return agent.LeaseReply{}, fmt.Errorf("lease %s: %w", req.Op, err)
	}
	var rep agent.LeaseReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("lease %s: bad reply: %w", req.Op, err)
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("lease %s: %s", req.Op, rep.Error)
	}
	return rep, nil
}
