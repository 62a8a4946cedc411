package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/peer"
	"github.com/denhq/den/registry"
)

// callerHeader carries, from one host of a cluster to another over
// their mutual TLS, the caller the first host established. Only the
// peer listener reads it.
const callerHeader = "Den-Caller"

// forwardedCaller is what callerHeader holds (JSON).
type forwardedCaller struct {
	User   string `json:"user"`
	Admin  bool   `json:"admin,omitempty"`
	Source string `json:"source"`
}

// forwardedKey marks a request a peer forwarded here (its value is that
// host): it is served here or refused, never forwarded again.
type forwardedKey struct{}

func forwardedBy(ctx context.Context) string {
	h, _ := ctx.Value(forwardedKey{}).(string)
	return h
}

// peers carries requests for VMs that another host of the cluster holds
// to that host, over mutual TLS with the cluster's CA, and serves the
// requests its peers forward here.
type peers struct {
	cred   *peer.Credential
	hosts  registry.HostStore  // the hosts' addresses
	leases machine.Leases      // which host holds a VM
	lease  time.Duration       // a host whose heartbeat is older is not alive
	m      placer              // what a VM needs, and what this host has
	compat string              // this host's machine.HostInfo.Compat
	mem    machine.LocalMemory // this host's local copies of memory, served to its peers
	log    *slog.Logger

	mu         sync.Mutex
	transports map[string]*http.Transport // by host and address
	drain      bool                       // this host drains, as read at drainAt
	drainAt    time.Time
}

// placer is what placement asks of this host's machine.
type placer interface {
	Need(ctx context.Context, name string) (machine.Need, error)
	Memory(ctx context.Context) machine.MemoryStatus
	Host() machine.HostInfo
}

func newPeers(cred *peer.Credential, hosts registry.HostStore, leases machine.Leases, lease time.Duration, m placer, log *slog.Logger) *peers {
	return &peers{cred: cred, hosts: hosts, leases: leases, lease: lease, m: m, compat: m.Host().Compat, log: log,
		transports: map[string]*http.Transport{}}
}

// whileHeld is ctx, ended when host lets vm's lease lapse: a host that
// froze or died no longer answers, and a request or session forwarded
// to it must not wait for it. It is looked at every Leases.Every. (A
// lease given back, or held by another host, is no lapse: the host
// finished with the VM, and its answer is on its way.)
func (p *peers) whileHeld(ctx context.Context, host, vm string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(p.leases.Every())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if l, err := p.leases.Get(ctx, vm); err == nil && l.Host == host && !l.Held() {
				cancel(fmt.Errorf("host %q, which holds vm %q, stopped renewing its lease (it is frozen, cut off or dead): %w", host, vm, machine.ErrBusy))
				return
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// released waits until this host no longer holds vm's lease.
func (p *peers) released(ctx context.Context, vm string) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		l, err := p.leases.Get(ctx, vm)
		if err == nil && (!l.Held() || l.Host != p.cred.Host()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("this host still holds vm %q (the digests of its memory are being written): %w", vm, ctx.Err())
		case <-t.C:
		}
	}
}

// address is where host's peer listener is, from its host record.
func (p *peers) address(ctx context.Context, host string) (string, error) {
	h, _, err := p.lookup(ctx, host)
	if err != nil {
		return "", fmt.Errorf("reach host %q: %w", host, err)
	}
	if h.Address == "" {
		return "", fmt.Errorf("reach host %q: it gives no address in its cluster config", host)
	}
	return h.Address, nil
}

// lookup is host's record, and the registry's clock to judge its
// heartbeat by.
func (p *peers) lookup(ctx context.Context, host string) (registry.Host, time.Time, error) {
	hosts, now, err := p.hosts.ListHosts(ctx)
	if err != nil {
		return registry.Host{}, now, err
	}
	for _, h := range hosts {
		if h.Name == host {
			return h, now, nil
		}
	}
	return registry.Host{}, now, fmt.Errorf("no host named %q shares this registry (den hosts lists them): %w", host, machine.ErrNotFound)
}

// alive refuses a host that is not alive in the registry (by its
// heartbeat) or gives no address; it returns that address.
func (p *peers) alive(ctx context.Context, host string) (string, error) {
	h, now, err := p.lookup(ctx, host)
	if err != nil {
		return "", err
	}
	if age := now.Sub(h.Heartbeat); age >= p.lease {
		return "", fmt.Errorf("host %q is not alive: its last heartbeat is %s old", host, age.Round(time.Second))
	}
	if h.Address == "" && host != p.cred.Host() {
		return "", fmt.Errorf("host %q gives no address in its cluster config", host)
	}
	return h.Address, nil
}

// place chooses, among the other live hosts that admit VMs, the one a
// VM that runs nowhere goes to when this host does not take it: of those
// with room in their memory budget for need and able to restore its
// memory, the one with the most free budget (need nil: a create, any
// host).
func (p *peers) place(ctx context.Context, need *machine.Need) (string, error) {
	hosts, now, err := p.hosts.ListHosts(ctx)
	if err != nil {
		return "", err
	}
	return choose(hosts, now, p.cred.Host(), p.lease, need)
}

// choose is place over hosts as the registry listed them at now.
func choose(hosts []registry.Host, now time.Time, self string, lease time.Duration, need *machine.Need) (string, error) {
	best, bestFree := "", int64(-1)
	var why []string
	for _, h := range hosts {
		if h.Name == self || h.Draining || h.Address == "" || now.Sub(h.Heartbeat) >= lease {
			continue
		}
		free := h.MemoryFreeBytes
		if h.MemoryBudgetBytes < 0 {
			free = math.MaxInt64 // no budget
		}
		if need != nil {
			if err := need.RestorableOn(h.Name, h.Compat); err != nil {
				why = append(why, err.Error())
				continue
			}
			if free < need.MemoryBytes {
				why = append(why, fmt.Sprintf("host %s has %s of its memory budget free, and vm %q needs %s",
					h.Name, size.Format(free), need.VM, size.Format(need.MemoryBytes)))
				continue
			}
		}
		if free > bestFree {
			best, bestFree = h.Name, free
		}
	}
	if best == "" {
		if len(why) > 0 {
			return "", fmt.Errorf("no other live host of the cluster can take it: %s: %w", strings.Join(why, "; "), machine.ErrBusy)
		}
		return "", fmt.Errorf("no other live host of the cluster admits vms (den hosts): %w", machine.ErrBusy)
	}
	return best, nil
}

// placeWake is the host that wakes or boots vm, which runs nowhere (""
// for this one): this host when it admits VMs, has room for it in its
// memory budget and can restore its memory; else the other host place
// chooses; else still this host, unless it is draining (its admission
// then makes room by putting idle VMs to sleep, or its refusal says why
// not).
func (p *peers) placeWake(ctx context.Context, vm string) (string, error) {
	drain := p.draining(ctx)
	need, err := p.m.Need(ctx, vm)
	switch {
	case err != nil && drain:
		return "", err
	case err != nil:
		return "", nil // served here: the request's own answer says why
	case !drain && p.fitsHere(ctx, need):
		return "", nil
	}
	to, err := p.place(ctx, &need)
	if err != nil {
		if drain {
			return "", fmt.Errorf("host %q is draining: %w", p.cred.Host(), err)
		}
		return "", nil
	}
	return to, nil
}

// restores refuses host when, by its record, it cannot restore vm's
// memory.
func (p *peers) restores(ctx context.Context, host, vm string) error {
	need, err := p.m.Need(ctx, vm)
	if err != nil {
		return err
	}
	compat := p.compat
	if host != p.cred.Host() {
		h, _, err := p.lookup(ctx, host)
		if err != nil {
			return err
		}
		compat = h.Compat
	}
	return need.RestorableOn(host, compat)
}

// fitsHere says whether this host has room for need in its memory budget
// now and can restore its memory.
func (p *peers) fitsHere(ctx context.Context, need machine.Need) bool {
	if need.RestorableOn(p.cred.Host(), p.compat) != nil {
		return false
	}
	mem := p.m.Memory(ctx)
	return mem.Budget < 0 || mem.Free >= need.MemoryBytes
}

// draining says whether this host is draining (den hosts drain): it
// admits no new VMs. The answer is at most a second old.
func (p *peers) draining(ctx context.Context) bool {
	p.mu.Lock()
	drain, fresh := p.drain, time.Since(p.drainAt) < time.Second
	p.mu.Unlock()
	if fresh {
		return drain
	}
	h, _, err := p.lookup(ctx, p.cred.Host())
	if err != nil {
		return drain
	}
	p.mu.Lock()
	p.drain, p.drainAt = h.Draining, time.Now()
	p.mu.Unlock()
	return h.Draining
}

// client is an API client of host's daemon, acting for c.
func (p *peers) client(ctx context.Context, host string, c Caller) (*api.Client, error) {
	addr, err := p.address(ctx, host)
	if err != nil {
		return nil, err
	}
	return api.NewDialClient("host "+host, p.dial(host, addr)).WithHeader(callerHeader, p.header(c)), nil
}

// dial connects to host's peer listener at addr, checking that its
// certificate is the cluster CA's for that host.
func (p *peers) dial(host, addr string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: p.cred.ClientTLS(host)}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("reach host %q at %s: %w", host, addr, err)
		}
		return c, nil
	}
}

// header is c as callerHeader carries it.
func (p *peers) header(c Caller) string {
	b, _ := json.Marshal(forwardedCaller{User: c.User, Admin: c.Admin, Source: c.Source})
	return string(b)
}

// forward has host serve r, as c, and relays its answer (a stream of
// progress events, an upgraded connection) back.
func (p *peers) forward(w http.ResponseWriter, r *http.Request, host, vm string, c Caller) {
	addr, err := p.address(r.Context(), host)
	if err != nil {
		writeError(w, fmt.Errorf("vm %q is held by host %q: %w", vm, host, err))
		return
	}
	if vm != "" {
		ctx, cancel := p.whileHeld(r.Context(), host, vm)
		defer cancel()
		r = r.WithContext(ctx)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", addr, host
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Set(callerHeader, p.header(c))
		},
		Transport:     p.transport(host, addr),
		FlushInterval: -1, // progress events as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if cause := context.Cause(r.Context()); cause != nil && cause != context.Canceled {
				err = cause
			}
			what := "request"
			if vm != "" {
				what = fmt.Sprintf("vm %q", vm)
			}
			writeError(w, fmt.Errorf("%s through host %q: %w", what, host, err))
		},
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	rp.ServeHTTP(w, r)
}

func (p *peers) transport(host, addr string) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := host + " " + addr
	if t, ok := p.transports[key]; ok {
		return t
	}
	dial := p.dial(host, addr)
	t := &http.Transport{
		DialTLSContext:  func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:    4,
		IdleConnTimeout: time.Minute,
	}
	p.transports[key] = t
	return t
}

// open opens a session on vm through host, which holds it, as c.
func (p *peers) open(ctx context.Context, host, vm string, c Caller) (*machine.Session, error) {
	cl, err := p.client(ctx, host, c)
	if err != nil {
		return nil, fmt.Errorf("vm %q is held by host %q: %w", vm, host, err)
	}
	defer cl.CloseIdle()
	// The session lasts beyond ctx (an operation's), for as long as the
	// host holds the VM.
	hctx, cancel := p.whileHeld(context.WithoutCancel(ctx), host, vm)
	octx, ocancel := context.WithCancel(hctx)
	stop := context.AfterFunc(ctx, ocancel)
	sc, err := cl.SSH(octx, vm)
	stop()
	ocancel()
	if err != nil {
		if cause := context.Cause(hctx); cause != nil {
			err = cause
		}
		cancel()
		return nil, fmt.Errorf("vm %q through host %q: %w", vm, host, err)
	}
	done := make(chan struct{})
	go func() { _ = sc.Wait(); close(done) }()
	go func() {
		select {
		case <-hctx.Done():
			_ = sc.Close() // the host was lost: the session ends
		case <-done:
			cancel()
		}
	}()
	return machine.RemoteSession(sc, done, func() { _ = sc.Close(); cancel() }), nil
}

// listen serves s to the cluster's peers on addr, over mutual TLS: a
// request is served as the caller its header names, established by the
// host (named by its certificate) that forwarded it. It returns the
// listener's close.
func (p *peers) listen(s *Server, addr string) (func(), error) {
	ln, err := tls.Listen("tcp", addr, p.cred.ServerTLS())
	if err != nil {
		return nil, fmt.Errorf("peer listener: %w", err)
	}
	srv := &http.Server{
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			from, err := peer.PeerHost(r.TLS)
			if err != nil {
				writeError(w, fmt.Errorf("peer: %w: %w", err, api.ErrUnauthenticated))
				return
			}
			if r.URL.Path == peerMemoryPath {
				serveMemory(w, r, p.mem, from)
				return
			}
			var fc forwardedCaller
			if err := json.Unmarshal([]byte(r.Header.Get(callerHeader)), &fc); err != nil || (fc.User == "" && !fc.Admin) {
				writeError(w, fmt.Errorf("peer %q: the request names no caller: %w", from, api.ErrUnauthenticated))
				return
			}
			c := Caller{User: fc.User, Admin: fc.Admin, Source: "host " + from + ": " + fc.Source}
			ctx := context.WithValue(withCaller(r.Context(), c), forwardedKey{}, from)
			s.ServeHTTP(w, r.WithContext(ctx))
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	p.log.Info("den: serving the cluster's peers", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}

// route is the other host that serves r, and the VM it is for (""
// when this host serves it): a VM another host holds is served there; a
// wake of a VM that runs nowhere goes where placeWake says; on a
// draining host, a create, and any request for a VM that runs nowhere,
// go to the host placement chooses. Sessions are routed by
// peerSessions.
func (p *peers) route(r *http.Request) (host, vm string) {
	ctx := r.Context()
	name, tail := vmOfPath(r.URL.Path)
	if tail == "ssh" {
		return "", ""
	}
	if name == "" {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/vms" || !p.draining(ctx) {
			return "", "" // not a create, or one this host takes
		}
		to, err := p.place(ctx, nil)
		if err != nil {
			return "", "" // refused here, as draining
		}
		return to, ""
	}
	l, err := p.leases.Get(ctx, name)
	switch {
	case err != nil:
		return "", ""
	case l.Held() && l.Host != p.cred.Host():
		return l.Host, name
	case l.Held():
		return "", "" // held here: served here
	}
	wakes := r.Method == http.MethodPost && (tail == "wake" || tail == "fork")
	if !wakes && !p.draining(ctx) {
		return "", ""
	}
	to, err := p.placeWake(ctx, name)
	if err != nil {
		return "", "" // refused here, as draining, if it starts anything
	}
	return to, ""
}

// vmOfPath is the VM a request's path names (/v1/vms/NAME/TAIL), and
// what of it (a tail of "ssh" opens a session: those go through
// peerSessions, which also serves a VM whose wake another host won).
func vmOfPath(path string) (name, tail string) {
	rest, ok := strings.CutPrefix(path, "/v1/vms/")
	if !ok || rest == "" {
		return "", ""
	}
	name, tail, _ = strings.Cut(rest, "/")
	return name, tail
}

// peerSessions opens sessions on the VMs this host runs or may wake,
// and, through their host, on VMs another host of the cluster holds.
type peerSessions struct {
	URLSessions
	records interface {
		Record(ctx context.Context, name string) (registry.VM, error)
	}
	p    *peers
	self string
}

// Open implements Sessions. A sleeping VM that another host holds
// (while it writes the digests of the memory it put to sleep, or while
// it wakes it) is waited for: woken here once that host lets it go, or,
// when that host woke it meanwhile, reached through it.
func (ps peerSessions) Open(ctx context.Context, name, owner string) (*machine.Session, error) {
	forwarded := forwardedBy(ctx) != ""
	target := "" // the host the session is opened through
	sleeping := func() bool {
		vm, err := ps.records.Record(ctx, name)
		return err == nil && vm.State == registry.StateSleeping
	}
	wait := func() error {
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm %q: waiting for the host that holds it to let it go: %w", name, errors.Join(machine.ErrBusy, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
			return nil
		}
	}
	for target == "" {
		if !forwarded {
			// A VM that runs nowhere wakes where placement says; one
			// another host holds is never opened here (that host may
			// let it go meanwhile, and placement is skipped): it is
			// reached through that host, or waited for while it sleeps.
			l, err := ps.p.leases.Get(ctx, name)
			switch {
			case err != nil:
				return nil, fmt.Errorf("vm %q: %w", name, err)
			case !l.Held():
				if target, err = ps.p.placeWake(ctx, name); err != nil {
					return nil, fmt.Errorf("vm %q: %w", name, err)
				}
				if target != "" {
					continue
				}
			case l.Host != ps.self:
				if !sleeping() {
					target = l.Host
					continue
				}
				if err := wait(); err != nil {
					return nil, err
				}
				continue
			}
		}
		s, err := ps.URLSessions.Open(ctx, name, owner)
		var held *machine.HeldError
		if !errors.As(err, &held) || forwarded {
			return s, err
		}
		if !sleeping() {
			target = held.Host
			continue
		}
		if err := wait(); err != nil {
			return nil, err
		}
	}
	c, ok := ctx.Value(callerKey{}).(Caller)
	switch {
	case ok:
	case owner != "":
		c = Caller{User: owner, Source: "ssh gateway of host " + ps.self}
	default:
		// A VM's URL, whose access this host checked.
		c = Caller{User: "den", Admin: true, Source: "url on host " + ps.self}
	}
	return ps.p.open(ctx, target, name, c)
}
