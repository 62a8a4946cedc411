package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/cluster"
	"github.com/denhq/den/fence"
	"github.com/denhq/den/internal/hostinfo"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// DefaultLease is how long a host's heartbeat keeps it alive.
const DefaultLease = cluster.DefaultLease

// defaultHostName is this machine's hostname as a den host name
// ("localhost" where it has none den takes).
func defaultHostName() string {
	name, err := os.Hostname()
	if err != nil || validate.HostName(name) != nil {
		return "localhost"
	}
	return strings.ToLower(name)
}

// heart renews this host's leases (its own and its VMs'), from the start of the daemon
// on, every tenth of the lease (so that a failed renewal or two, a
// PostgreSQL restart say, leave time before the fence's deadline at half
// the lease), and, once a Manager is attached, records the host in the
// registry every third.
type heart struct {
	store registry.Store
	lease time.Duration
	log   *slog.Logger
	// cluster is what this host of a cluster holds (nil: one host, no
	// lease). lost is closed, with lostErr set, when a renewal finds the
	// lease gone: another host took over, or it lapsed.
	cluster *clusterHost
	lost    chan struct{}
	lostErr error
	// rec is what the host records (nil until attach).
	rec atomic.Pointer[recorder]

	stop context.CancelFunc
	done chan struct{}
}

// recorder is what a host's record is made of.
type recorder struct {
	m    *machine.Manager
	self registry.Host // the fields that do not change
}

// startHeart renews this host's leases at once (a start fails when it
// cannot) and goes on until stopped.
func startHeart(ctx context.Context, store registry.Store, lease time.Duration, cluster *clusterHost, log *slog.Logger) (*heart, error) {
	h := &heart{store: store, lease: lease, log: log, cluster: cluster, lost: make(chan struct{}), done: make(chan struct{})}
	if err := h.renew(ctx); err != nil {
		return nil, err
	}
	bctx, stop := context.WithCancel(context.Background())
	h.stop = stop
	go h.run(bctx)
	return h, nil
}

// attach records the host, now and from then on, with m's counts.
func (h *heart) attach(ctx context.Context, m *machine.Manager, self registry.Host) error {
	r := &recorder{m: m, self: self}
	if err := r.record(ctx, h.store); err != nil {
		return err
	}
	h.rec.Store(r)
	return nil
}

func (h *heart) run(ctx context.Context) {
	defer close(h.done)
	tick := h.lease / 3
	if h.cluster != nil {
		tick = h.lease / 10
	}
	// A renewal the registry did not answer is tried again sooner: the
	// registry back from a restart is seen within retry, not a tick.
	retry := min(tick, 250*time.Millisecond)
	t := time.NewTimer(tick)
	defer t.Stop()
	recorded := time.Now()
	var failing error
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := time.Now().Add(tick)
		rctx, cancel := context.WithTimeout(ctx, h.lease/4)
		err := h.renew(rctx)
		cancel()
		var away unrenewed
		soon := errors.As(err, &away)
		if r := h.rec.Load(); err == nil && r != nil && time.Since(recorded) >= h.lease/3 {
			rctx, cancel := context.WithTimeout(ctx, h.lease)
			if err = r.record(rctx, h.store); err == nil {
				recorded = time.Now()
			}
			cancel()
		}
		if errors.Is(err, registry.ErrLeaseLost) {
			h.cluster.fenceNow()
			h.lostErr = err
			close(h.lost)
			return
		}
		switch {
		case err != nil && failing == nil && ctx.Err() == nil:
			h.log.Warn("den: heartbeat failed", "err", err)
			failing = err
		case err == nil && failing != nil:
			h.log.Info("den: heartbeat recorded again")
			failing = nil
		}
		wait := time.Until(next)
		if soon {
			wait = retry
		}
		t.Reset(max(wait, 0))
	}
}

// unrenewed is a renewal the registry did not answer.
type unrenewed struct{ error }

func (u unrenewed) Unwrap() error { return u.error }

// renew renews this host's leases (nothing to do on one host) and pushes
// the fence's deadline. It wraps registry.ErrLeaseLost when the lease is
// gone, and is an unrenewed when the registry did not answer.
func (h *heart) renew(ctx context.Context) error {
	c := h.cluster
	if c == nil {
		return nil
	}
	t0 := fence.Now()
	renewed, err := h.store.RenewLeases(ctx, c.lease.Host, c.lease.Instance, h.lease)
	if err != nil {
		return unrenewed{err}
	}
	held := false
	for _, l := range renewed {
		if l.VM == c.lease.VM && l.Generation == c.lease.Generation {
			held = true
		}
	}
	if !held {
		cur, _ := h.store.GetLease(ctx, c.lease.VM)
		if cur.Host == c.lease.Host && cur.Instance == c.lease.Instance && cur.Generation == c.lease.Generation {
			return fmt.Errorf("cluster: this host (%s) lost its host lease of generation %d: it expired at %s, unrenewed for longer than the lease (%s): %w",
				c.lease.Host, c.lease.Generation, cur.Expires.Format(time.RFC3339), h.lease, registry.ErrLeaseLost)
		}
		return fmt.Errorf("cluster: this host (%s) lost its host lease of generation %d: now daemon %s holds generation %d: %w",
			c.lease.Host, c.lease.Generation, cur.Instance, cur.Generation, registry.ErrLeaseLost)
	}
	if err := c.push(t0); err != nil {
		return err
	}
	return c.guard()
}

// record records the host with its counts now.
func (r *recorder) record(ctx context.Context, store registry.Store) error {
	rec := r.self
	mem := r.m.Memory(ctx)
	rec.MemoryBudgetBytes, rec.MemoryFreeBytes = mem.Budget, mem.Free
	if mem.Budget < 0 {
		rec.MemoryBudgetBytes, rec.MemoryFreeBytes = -1, -1
	}
	rec.Running = mem.Running // this host's: other hosts of a cluster run theirs
	vms, err := store.ListVMs(ctx, "")
	if err != nil {
		return err
	}
	for _, vm := range vms {
		if vm.State == registry.StateSleeping {
			rec.Sleeping++ // owned by no host: any may wake it
		}
	}
	return store.Heartbeat(ctx, rec)
}

func (h *heart) close() {
	if h.stop != nil {
		h.stop()
		<-h.done
	}
}

// hostSelf describes this host for its record.
func hostSelf(name, address, version string, here machine.HostInfo) registry.Host {
	model, cpus := hostinfo.CPU()
	return registry.Host{Name: name, Address: address, Version: version, VMM: here.VMM, CPUModel: model, CPUs: cpus,
		Compat: here.Compat, StartedAt: time.Now().UTC()}
}

// hostsView answers GET /v1/hosts from the registry.
type hostsView struct {
	store   registry.HostStore
	backend string // the registry's: sqlite or postgres
	self    string
	lease   time.Duration
}

// listHosts answers the hosts that share the registry, with their
// liveness by the registry's clock.
func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) {
	if s.hosts == nil {
		writeError(w, errors.New("this daemon keeps no host records"))
		return
	}
	hosts, now, err := s.hosts.store.ListHosts(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := api.HostList{Hosts: []api.Host{}, Registry: s.hosts.backend, LeaseMS: s.hosts.lease.Milliseconds()}
	for _, h := range hosts {
		age := now.Sub(h.Heartbeat)
		out.Hosts = append(out.Hosts, api.Host{Name: h.Name, Address: h.Address, Version: h.Version, VMM: h.VMM,
			CPUModel: h.CPUModel, CPUs: h.CPUs, MemoryBudgetBytes: h.MemoryBudgetBytes, MemoryFreeBytes: h.MemoryFreeBytes,
			Running: h.Running, Sleeping: h.Sleeping, Draining: h.Draining, StartedAt: h.StartedAt, Heartbeat: h.Heartbeat,
			HeartbeatAgeMS: age.Milliseconds(), Alive: age < s.hosts.lease, This: h.Name == s.hosts.self})
	}
	writeJSON(w, http.StatusOK, out)
}
