package egress

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds one query to one upstream when Options.Timeout
// is zero.
const DefaultTimeout = 2 * time.Second

// ResolvConf is where NewResolver reads the upstreams when
// Options.Upstreams is empty.
const ResolvConf = "/etc/resolv.conf"

// Options configure a Resolver.
type Options struct {
	// Upstreams are the servers queries go to, in order (host:port). If
	// empty, the nameservers of /etc/resolv.conf, port 53, read again
	// whenever the file changes.
	Upstreams []string
	// Allow, if set, is called with the A records of every answer to a
	// name the VM's policy lists (an allow list's, or a deny list's
	// exceptions), before the VM gets the answer: the firewall should
	// let the VM reach addrs for ttl (the smallest TTL of the records,
	// between one minute and one hour), unless the VM's policy is no
	// longer p, the one the answer was made under. Once Stop(vm) or
	// Close returned, no new call for vm begins.
	Allow func(vm string, p Policy, addrs []netip.Addr, ttl time.Duration)
	// Logger gets the resolver's warnings and, at debug level, its
	// refusals (slog.Default() if nil).
	Logger *slog.Logger
	// Timeout bounds one query to one upstream, a retry over TCP
	// included (DefaultTimeout if zero).
	Timeout time.Duration
	// Intercept, if set, is asked of every name a VM's policy lets it
	// resolve: true answers the name with the VM's own resolver address
	// (IPv4 only, a TTL of a few seconds), where den takes the VM's
	// connections over (HTTPS secrets); see Resolve for where den then
	// goes.
	Intercept func(vm, name string) bool
}

// Resolver is the DNS server of VMs: each VM has a UDP and a TCP
// listener and a policy, and the resolver answers it the names its
// policy allows (see Serve).
type Resolver struct {
	o    Options
	log  *slog.Logger
	conf *resolvConf
	// lastWarn is when the resolver last warned that its upstreams
	// failed (unix nanoseconds).
	lastWarn atomic.Int64

	// life serializes Serve, Stop and Close; mu guards vms and closed.
	life   sync.Mutex
	mu     sync.Mutex
	vms    map[string]*served
	closed bool
}

// NewResolver makes a resolver serving no VM yet.
func NewResolver(o Options) *Resolver {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	r := &Resolver{o: o, log: o.Logger, vms: map[string]*served{}}
	if len(o.Upstreams) == 0 {
		r.conf = &resolvConf{path: ResolvConf}
	}
	return r
}

// errClosed is Serve's error after Close.
var errClosed = errors.New("the resolver is closed")

// Serve answers vm's queries on addr (UDP and TCP) under policy p. The
// address need not be configured on the host yet (the listeners are
// bound with IP_FREEBIND); the listeners are bound when Serve returns.
// Serving vm again replaces its listeners and policy (its Stats go on);
// if that fails, vm is no longer served.
func (r *Resolver) Serve(vm string, addr netip.AddrPort, p Policy) error {
	if !addr.IsValid() || addr.Port() == 0 {
		return fmt.Errorf("dns for vm %s: bad listen address %s (want ip:port, port not 0)", vm, addr)
	}
	r.life.Lock()
	defer r.life.Unlock()
	r.mu.Lock()
	old, closed := r.vms[vm], r.closed
	r.mu.Unlock()
	if closed {
		return fmt.Errorf("dns for vm %s: %w", vm, errClosed)
	}
	st := &stats{}
	if old != nil {
		old.stop()
		st = old.stats
	}
	s, err := r.start(vm, addr, p.clone(), st)
	if err != nil {
		r.mu.Lock()
		delete(r.vms, vm)
		r.mu.Unlock()
		return fmt.Errorf("dns for vm %s on %s: %w", vm, addr, err)
	}
	r.mu.Lock()
	r.vms[vm] = s
	r.mu.Unlock()
	return nil
}

// SetPolicy changes vm's policy from its next query on. It does nothing
// if vm is not served.
func (r *Resolver) SetPolicy(vm string, p Policy) {
	r.mu.Lock()
	s := r.vms[vm]
	r.mu.Unlock()
	if s != nil {
		p = p.clone()
		s.policy.Store(&p)
	}
}

// Stop closes vm's listeners, ends its queries under way and forgets
// its Stats. It does nothing if vm is not served.
func (r *Resolver) Stop(vm string) {
	r.life.Lock()
	defer r.life.Unlock()
	r.mu.Lock()
	s := r.vms[vm]
	delete(r.vms, vm)
	r.mu.Unlock()
	if s != nil {
		s.stop()
	}
}

// Close stops every VM; Serve fails afterwards.
func (r *Resolver) Close() {
	r.life.Lock()
	defer r.life.Unlock()
	r.mu.Lock()
	r.closed = true
	vms := r.vms
	r.vms = map[string]*served{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range vms {
		wg.Go(s.stop)
	}
	wg.Wait()
}

// Stats are the counters of a VM's resolver.
type Stats struct {
	// Queries counts every query the VM sent.
	Queries uint64
	// Refused counts the queries its policy refused (deny-all) or whose
	// name it does not allow.
	Refused uint64
	// LastRefused are the last names refused (at most 16, each once,
	// oldest first).
	LastRefused []string
}

// NameOf is the name whose answer to vm last gave address a, "" if the
// resolver does not remember one (it keeps the newest few thousand).
func (r *Resolver) NameOf(vm string, a netip.Addr) string {
	r.mu.Lock()
	s := r.vms[vm]
	r.mu.Unlock()
	if s == nil {
		return ""
	}
	return s.stats.nameOf(a.Unmap())
}

// Stats are vm's counters since it was first served (zero if it is not
// served).
func (r *Resolver) Stats(vm string) Stats {
	r.mu.Lock()
	s := r.vms[vm]
	r.mu.Unlock()
	if s == nil {
		return Stats{}
	}
	return s.stats.get()
}
