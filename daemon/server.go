// Package daemon serves den's HTTP+JSON API on a unix socket, backed by
// the machine manager, and runs the daemon's life: volume, manager,
// socket, shutdown.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/mcpserver"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/secrets"
	"github.com/denhq/den/users"
)

// Server answers API requests.
type Server struct {
	m       Lifecycle
	keys    users.Keys
	info    api.DaemonInfo
	web     *ingressServer // the VMs' HTTP URLs (nil: off)
	traces  traces         // each VM's last operation's steps
	hostKey ssh.Signer
	log     *slog.Logger
	mux     *http.ServeMux
	conns   sync.WaitGroup
	// bearer establishes a caller from a request's bearer token (nil:
	// no TLS listener).
	bearer func(*http.Request) (Caller, error)
	tokens users.Tokens
	held   tokenConns // connections each bearer token holds open
	audit  *audit.Log // nil: none
	// secrets are den's secrets and their grants (nil: none).
	secrets *secrets.Store
	// keyAgents gives VMs' guests what they hold of their secrets.
	keyAgents *keyAgents
	hosts     *hostsView // the registry's host records (nil: none)
	// inproc makes the connections the MCP handler's calls take, as its
	// request's caller (nil: no MCP).
	inproc *inProcess
	mcp    http.Handler
	// sessions opens sessions on VMs (m, or through the host that holds
	// a VM: peerSessions); peers forwards the requests for a VM another
	// host holds to it (nil: one host, or a cluster without addresses).
	sessions Sessions
	peers    *peers
}

// NewServer returns the API handler for m.
func NewServer(m Lifecycle, keys users.Keys, info api.DaemonInfo, hostKey ssh.Signer, log *slog.Logger) *Server {
	s := &Server{m: m, keys: keys, info: info, hostKey: hostKey, log: log, mux: http.NewServeMux(), sessions: m}
	s.mcp = mcpserver.HTTPHandler(s.mcpClient, (*api.Client).CloseIdle, log)
	for _, rt := range routes {
		s.mux.HandleFunc(rt.pattern, guard(func(w http.ResponseWriter, r *http.Request) { rt.handle(s, w, r) }))
	}
	return s
}

// route is one route of the API: its method and path pattern (as
// http.ServeMux reads it) and its handler.
type route struct {
	pattern string
	handle  func(*Server, http.ResponseWriter, *http.Request)
}

// routes is the API: NewServer serves each of them, and api/openapi.yaml
// describes each of them (TestOpenAPIRoutes holds the two together).
var routes = []route{
	{"GET /v1/info", (*Server).getInfo},
	{"GET /v1/openapi.yaml", (*Server).getOpenAPI},
	{"GET /v1/vms", (*Server).listVMs},
	{"POST /v1/vms", (*Server).createVM},
	{"GET /v1/vms/{name}", (*Server).getVM},
	{"DELETE /v1/vms/{name}", (*Server).removeVM},
	{"GET /v1/vms/{name}/logs", (*Server).logs},
	{"POST /v1/vms/{name}/ssh", (*Server).sshUpgrade},
	{"GET /v1/vms/{name}/checkpoints", (*Server).listCheckpoints},
	{"POST /v1/vms/{name}/checkpoints", (*Server).createCheckpoint},
	{"DELETE /v1/vms/{name}/checkpoints/{id}", (*Server).deleteCheckpoint},
	{"POST /v1/vms/{name}/checkpoints/verify", (*Server).verifyCheckpoints},
	{"POST /v1/vms/{name}/restore", (*Server).restore},
	{"POST /v1/vms/{name}/restore-paths", (*Server).restorePaths},
	{"POST /v1/vms/{name}/fork", (*Server).fork},
	{"POST /v1/vms/{name}/diff", (*Server).diff},
	{"GET /v1/vms/{name}/activity", (*Server).activityOf},
	{"POST /v1/vms/{name}/activity/record", (*Server).setActivityRecord},
	{"POST /v1/vms/{name}/sleep", (*Server).sleep},
	{"POST /v1/vms/{name}/wake", (*Server).wake},
	{"POST /v1/vms/{name}/move", (*Server).move},
	{"POST /v1/vms/{name}/resize", (*Server).resize},
	{"GET /v1/vms/{name}/trace", (*Server).getTrace},
	{"GET /v1/vms/{name}/net", (*Server).getNet},
	{"POST /v1/vms/{name}/egress", (*Server).setEgress},
	{"GET /v1/vms/{name}/url", (*Server).getURL},
	{"POST /v1/vms/{name}/url", (*Server).setURL},
	{"GET /v1/vms/{name}/schedule", (*Server).getSchedule},
	{"POST /v1/vms/{name}/schedule", (*Server).setSchedule},
	{"POST /v1/host/sleep", (*Server).hostSleep},
	{"POST /v1/host/wake", (*Server).hostWake},
	{"POST /v1/host/gc", (*Server).collectGarbage},
	{"GET /v1/storage", (*Server).getStorage},
	{"GET /v1/hosts", (*Server).listHosts},
	{"POST /v1/hosts/{host}/drain", (*Server).drainHost},
	{"GET /v1/keys", (*Server).listKeys},
	{"POST /v1/keys", (*Server).addKey},
	{"DELETE /v1/keys", (*Server).removeKey},
	{"GET /v1/tokens", (*Server).listTokens},
	{"POST /v1/tokens", (*Server).addToken},
	{"DELETE /v1/tokens", (*Server).removeToken},
	{"GET /v1/secrets", onSecrets(secretsAPI.listSecrets)},
	{"POST /v1/secrets", onSecrets(secretsAPI.addSecret)},
	{"PUT /v1/secrets/{secret}", onSecrets(secretsAPI.setSecret)},
	{"DELETE /v1/secrets/{secret}", onSecrets(secretsAPI.removeSecret)},
	{"GET /v1/vms/{name}/secrets", onSecrets(secretsAPI.vmSecrets)},
	{"POST /v1/vms/{name}/secrets", onSecrets(secretsAPI.grantSecret)},
	{"DELETE /v1/vms/{name}/secrets/{secret}", onSecrets(secretsAPI.revokeSecret)},
	{"GET /v1/audit", (*Server).getAudit},
	{"POST /v1/mcp", (*Server).serveMCP},
}

// ServeHTTP establishes the request's caller from its connection (or its
// bearer token, on the TLS listener), refusing it (401) when there is
// none, and serves it as that caller.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	caller, err := s.identify(r)
	if err != nil {
		writeError(w, err)
		s.auditCall(Caller{Source: sourceOf(r)}, r, http.StatusUnauthorized, start)
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	// The machine checks the owner again under each VM's lock.
	r = r.WithContext(machine.AsOwner(withCaller(r.Context(), caller), caller.owner()))
	if s.peers != nil && forwardedBy(r.Context()) == "" {
		if host, vm := s.peers.route(r); host != "" {
			s.peers.forward(rec, r, host, vm, caller)
			s.auditCall(caller, r, rec.status, start)
			return
		}
	}
	s.mux.ServeHTTP(rec, r)
	s.auditCall(caller, r, rec.status, start)
}

// sourceOf names where a request that proved no caller came from.
func sourceOf(r *http.Request) string {
	if r.RemoteAddr == "" || r.RemoteAddr == "@" {
		return "unix"
	}
	return "tls " + r.RemoteAddr
}

// identify is the request's caller: the one its connection established,
// or, on a connection that establishes none (TLS), its bearer token's.
func (s *Server) identify(r *http.Request) (Caller, error) {
	if c, ok := r.Context().Value(callerKey{}).(Caller); ok {
		return c, nil
	}
	if err, ok := r.Context().Value(connErrKey{}).(error); ok {
		return Caller{}, fmt.Errorf("who is calling: %w: %w", err, api.ErrUnauthenticated)
	}
	if s.bearer == nil {
		return Caller{}, fmt.Errorf("who is calling: no credentials: %w", api.ErrUnauthenticated)
	}
	return s.bearer(r)
}

// writeJSON answers v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorCode maps a machine error onto an API error code.
func errorCode(err error) string {
	switch {
	case errors.Is(err, machine.ErrNotFound), errors.Is(err, users.ErrNotFound), errors.Is(err, secrets.ErrNotFound):
		return "not_found"
	case errors.Is(err, machine.ErrExists), errors.Is(err, users.ErrExists), errors.Is(err, secrets.ErrExists):
		return "exists"
	case errors.Is(err, machine.ErrInvalid), errors.Is(err, users.ErrInvalid), errors.Is(err, egress.ErrInvalid), errors.Is(err, secrets.ErrInvalid):
		return "invalid"
	case errors.Is(err, machine.ErrBusy):
		return "busy"
	case errors.Is(err, machine.ErrDamaged):
		return "damaged"
	case errors.Is(err, machine.ErrConflict), errors.Is(err, registry.ErrIllegalTransition), errors.Is(err, registry.ErrStale):
		return "conflict"
	case errors.Is(err, machine.ErrNoSpace), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "no_space"
	case errors.Is(err, machine.ErrNoMemory):
		return "no_memory"
	case errors.Is(err, api.ErrUnauthenticated):
		return "unauthenticated"
	case errors.Is(err, api.ErrForbidden):
		return "forbidden"
	}
	return "internal"
}

func writeError(w http.ResponseWriter, err error) {
	code := errorCode(err)
	writeJSON(w, api.Codes[code].Status, api.ErrorBody{Error: err.Error(), Code: code})
}

func (s *Server) getInfo(w http.ResponseWriter, r *http.Request) {
	info := s.info
	info.Memory = memoryInfo(s.m.Memory(r.Context()))
	user, cg, missing := s.m.Confinement()
	conf := &api.Confinement{User: user, Missing: missing, CgroupVersion: cg}
	if user != "" {
		conf.Guarded, _ = s.m.VMMGuard(r.Context())
	}
	info.Confinement = conf
	writeJSON(w, http.StatusOK, info)
}

func toAPI(st machine.Status) api.VM {
	vm := api.VM{
		Name: st.Name, Owner: st.Owner, State: string(st.State), Reason: st.Reason, Image: st.Image,
		CPUs: st.CPUs, MemoryBytes: st.MemoryBytes, DiskBytes: st.DiskBytes, DiskUsed: st.DiskUsed, DiskUsedPending: st.DiskMeasuring,
		VMM: st.VMM, Accel: st.Accel, PID: st.PID, Host: st.Host, IdleTimeout: st.IdleTimeout.String(),
		CreatedAt: st.CreatedAt, LastActive: st.LastActive, Operation: st.Op, Generation: st.Generation,
		Network: st.Net, IP: st.IP, Egress: st.Egress,
	}
	if st.Op != "" {
		vm.OperationFor = st.OpFor.Round(time.Second).String()
	}
	if g := st.Cgroup; g != nil {
		vm.Cgroup = &api.Cgroup{Name: g.Name, Version: g.Version, MemoryMax: g.Limits.MemoryMax, CPUQuota: g.Limits.CPUQuota,
			PidsMax: g.Limits.PidsMax, IOWeight: g.Limits.IOWeight, MemoryCurrent: g.Use.MemoryCurrent,
			CPUSeconds: g.Use.CPUSeconds, PidsCurrent: g.Use.PidsCurrent}
	}
	return vm
}

// authorize checks, from the VM's record alone and before anything looks
// at the VM itself, that the request's owner may use it: another user's
// VM is "not found", with no hint that it exists.
func (s *Server) authorize(r *http.Request, name string) error {
	rec, err := s.m.Record(r.Context(), name)
	if err != nil {
		return err
	}
	if owner(r) != "" && rec.Owner != owner(r) {
		return fmt.Errorf("no vm named %q: %w", name, machine.ErrNotFound)
	}
	return nil
}

// getOwned reads a VM that the request's owner may see.
func (s *Server) getOwned(r *http.Request, name string) (machine.Status, error) {
	if err := s.authorize(r, name); err != nil {
		return machine.Status{}, err
	}
	return s.m.Get(r.Context(), name)
}

// owned answers "not found" itself (true: go on) unless the request's
// owner may use the VM.
func (s *Server) owned(w http.ResponseWriter, r *http.Request, name string) bool {
	if err := s.authorize(r, name); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

func (s *Server) listVMs(w http.ResponseWriter, r *http.Request) {
	sts, err := s.m.List(r.Context(), owner(r))
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.VM, 0, len(sts))
	for _, st := range sts {
		out = append(out, toAPI(st))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVM(w http.ResponseWriter, r *http.Request) {
	st, err := s.getOwned(r, r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPI(st))
}

// briefVM answers a lifecycle verb with the VM as it now is, its disk's
// use as last measured (machine.Brief): the verb was authorised already.
func (s *Server) briefVM(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.Brief(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPI(st))
}

func (s *Server) removeVM(w http.ResponseWriter, r *http.Request) {
	force, err := boolQuery(r, "force")
	if err != nil {
		writeError(w, err)
		return
	}
	if !s.owned(w, r, r.PathValue("name")) {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	vm, refErr := secretsAPI{s}.vmRef(r, r.PathValue("name"))
	if err := s.m.Remove(ctx, r.PathValue("name"), force); err != nil {
		writeError(w, err)
		return
	}
	if s.secrets != nil && refErr == nil {
		// Its grants go with it (a later VM of the name would not have
		// them anyway: a grant names when its VM was made).
		if err := s.secrets.ForgetVM(vm); err != nil {
			s.log.Warn("den: the removed vm's secret grants stay", "vm", vm.Name, "err", err)
		}
	}
	if s.keyAgents != nil {
		s.keyAgents.forget(r.PathValue("name"))
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !s.owned(w, r, r.PathValue("name")) {
		return
	}
	_ = s.m.Logs(r.Context(), r.PathValue("name"), w)
}

// createVM streams progress events, then the VM or the error. The work
// goes on if the client goes away: a VM is never left half-made by a
// dropped connection (and is rolled back if creation fails).
func (s *Server) createVM(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRequest
	if !decode(w, r, &req) {
		return
	}
	if err := forUser(r, "create vm", req.Owner); err != nil {
		writeError(w, err)
		return
	}
	if owner(r) != "" {
		req.Owner = owner(r)
	}
	if s.peers != nil && s.peers.draining(r.Context()) {
		writeError(w, fmt.Errorf("create vm %q: this host is draining and no other host of the cluster admits vms: %w", req.Name, machine.ErrBusy))
		return
	}
	opts := machine.CreateOptions{Name: req.Name, Owner: req.Owner, Image: req.Image, CPUs: req.CPUs,
		MemoryBytes: req.MemoryBytes, DiskBytes: req.DiskBytes, IdleTimeout: -1, Cold: req.Cold, RestartOnHostLoss: req.OnHostLoss == "restart"}
	if req.Egress != "" {
		p, err := egress.Parse(req.Egress)
		if err != nil {
			writeError(w, err)
			return
		}
		opts.Egress = &p
	}
	if req.IdleTimeout != "" {
		d, err := time.ParseDuration(req.IdleTimeout)
		if req.IdleTimeout == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: fmt.Sprintf("bad idle timeout %q: use a duration like 10m, or 0 for never", req.IdleTimeout), Code: "invalid"})
			return
		}
		opts.IdleTimeout = d
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		ctx, done := s.trace(ctx, opts.Name, "create")
		vm, err := s.m.Create(ctx, opts, progress)
		done()
		if err != nil {
			return api.Event{}, err
		}
		return s.vmEvent(ctx, vm.Name)
	})
}

// stream runs a long operation detached from the request's context,
// writing one JSON event per line as it goes. The 200 header is written
// lazily, with the first event: an operation that fails before any
// progress (a bad name, an unknown VM or checkpoint, a name taken) is
// answered like any other request, with its error's status and an
// api.ErrorBody. Once the stream has started, it ends with exactly one
// final event (Done) that carries the result or the error and its code.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, op func(context.Context, machine.Progress) (api.Event, error)) {
	st := &eventStream{w: w, enc: json.NewEncoder(w), start: time.Now()}
	st.fl, _ = w.(http.Flusher)
	ctx, cancel := opContext(r)
	defer cancel()
	ev, err := op(ctx, func(step string) { st.emit(api.Event{Progress: step}) })
	if err != nil {
		st.fail(err)
		return
	}
	ev.Done = true
	st.final(ev)
}

// eventStream writes a streamed answer's events; see stream.
type eventStream struct {
	w     http.ResponseWriter
	fl    http.Flusher
	enc   *json.Encoder
	start time.Time

	mu      sync.Mutex
	started bool // the 200 header is written
	ended   bool // the final event is written: nothing more is
}

// emit writes a progress event (starting the stream).
func (st *eventStream) emit(ev api.Event) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.writeLocked(ev)
}

// final writes the final event and ends the stream.
func (st *eventStream) final(ev api.Event) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.writeLocked(ev)
	st.ended = true
}

// fail ends the answer with err: a plain error answer while nothing has
// been streamed, else the stream's final event.
func (st *eventStream) fail(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return
	}
	if !st.started {
		st.ended = true
		writeError(st.w, err)
		return
	}
	st.writeLocked(api.Event{Error: err.Error(), Code: errorCode(err), Done: true})
	st.ended = true
}

func (st *eventStream) writeLocked(ev api.Event) {
	if st.ended {
		return // a straggling progress line after the end
	}
	if !st.started {
		st.w.Header().Set("Content-Type", "application/x-ndjson")
		st.w.WriteHeader(http.StatusOK)
		st.started = true
	}
	ev.Elapsed = time.Since(st.start).Round(time.Millisecond).String()
	_ = st.enc.Encode(ev)
	if st.fl != nil {
		st.fl.Flush()
	}
}

// OpTimeout bounds one API operation (create, checkpoint, restore, fork,
// sleep, wake): it then fails and rolls back.
const OpTimeout = 15 * time.Minute

// opContext is the context of an operation a request asked for: detached
// from the request (a dropped connection never leaves a VM half-made),
// bounded by OpTimeout, and telling lock waits when the client left.
func opContext(r *http.Request) (context.Context, context.CancelFunc) { return detach(r.Context()) }

// detach is the context of an operation a client asked for in ctx: see
// opContext.
func detach(client context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(client), OpTimeout)
	return machine.WithClient(ctx, client), cancel
}

// vmEvent is the final event of an operation that leaves a VM.
func (s *Server) vmEvent(ctx context.Context, name string) (api.Event, error) {
	st, err := s.m.Brief(ctx, name)
	if err != nil {
		return api.Event{}, err
	}
	vm := toAPI(st)
	return api.Event{VM: &vm}, nil
}
