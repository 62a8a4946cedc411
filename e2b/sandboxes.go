package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/internal/validate"
)

const (
	// defaultTimeout is a sandbox's timeout when the create call gives
	// none (E2B's default).
	defaultTimeout = 15 * time.Second
	// maxTimeout is the longest timeout den takes (E2B's longest).
	maxTimeout = 24 * time.Hour
	// maxBody caps control plane request bodies.
	maxBody = 1 << 20
)

// never is the endAt of a sandbox without a timeout (a VM made with den
// create, or one paused): E2B's schema requires a time.
var never = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

func (s *Server) controlRoutes() {
	create := s.authed(s.create)
	s.mux.HandleFunc("POST /sandboxes", create)
	s.mux.HandleFunc("POST /v2/sandboxes", create)
	s.mux.HandleFunc("GET /sandboxes", s.authed(s.listV1))
	s.mux.HandleFunc("GET /v2/sandboxes", s.authed(s.listV2))
	s.mux.HandleFunc("GET /sandboxes/{id}", s.authed(s.get))
	s.mux.HandleFunc("DELETE /sandboxes/{id}", s.authed(s.kill))
	s.mux.HandleFunc("POST /sandboxes/{id}/timeout", s.authed(s.setTimeout))
	s.mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.authed(s.refresh))
	s.mux.HandleFunc("POST /sandboxes/{id}/pause", s.authed(s.pause))
	s.mux.HandleFunc("POST /sandboxes/{id}/resume", s.authed(s.resume))
	s.mux.HandleFunc("POST /sandboxes/{id}/fork", s.authed(s.fork))
	s.mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.authed(s.createSnapshot))
	s.mux.HandleFunc("GET /snapshots", s.authed(s.listSnapshots))
	s.mux.HandleFunc("DELETE /templates/{id}", s.authed(s.deleteTemplate))
	connect := s.authed(s.connect)
	s.mux.HandleFunc("POST /sandboxes/{id}/connect", connect)
	s.mux.HandleFunc("POST /v2/sandboxes/{id}/connect", connect)
	s.metricsRoutes()
	s.logRoutes()
	s.unsupportedRoutes()
}

// newSandbox is the body of a create call; fields den does not take
// are refused when set rather than ignored.
type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	AutoPause           bool                    `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              bool                    `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *networkConfig          `json:"network"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	MCP                 json.RawMessage         `json:"mcp"`
	IAM                 json.RawMessage         `json:"iam"`
	VolumeMounts        json.RawMessage         `json:"volumeMounts"`
}

type networkConfig struct {
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	Rules              json.RawMessage `json:"rules"`
	MaskRequestHost    json.RawMessage `json:"maskRequestHost"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts"`
}

// sandbox is E2B's Sandbox: what create and connect answer.
type sandbox struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// Domain is what the SDK's getHost puts after PORT-ID.
	Domain             string `json:"domain,omitempty"`
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox.
type sandboxDetail struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	AllowInternet   *bool             `json:"allowInternetAccess,omitempty"`
	Domain          string            `json:"domain,omitempty"`
	Lifecycle       *lifecycle        `json:"lifecycle,omitempty"`
	Network         *networkDetail    `json:"network,omitempty"`
}

// lifecycle is E2B's SandboxLifecycle: what a timeout does.
type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// networkDetail is the part of E2B's SandboxNetworkConfig den keeps.
type networkDetail struct {
	AllowPublicTraffic bool `json:"allowPublicTraffic"`
}

// clientID is E2B's deprecated client id: den has one kind of client.
const clientID = "den"

// decodeBody decodes a JSON body into v; an empty body leaves v as it
// is when emptyOK.
func decodeBody(r *http.Request, v any, emptyOK bool) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(data) > maxBody {
		return fmt.Errorf("the body is over %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		if emptyOK {
			return nil
		}
		return errors.New("the body is empty: send a JSON object")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("the body is not the JSON this call takes: %w", err)
	}
	return nil
}

// seconds turns a timeout in seconds into a duration within den's
// bounds.
func seconds(n int64) (time.Duration, error) {
	if n < 0 || time.Duration(n)*time.Second > maxTimeout {
		return 0, fmt.Errorf("bad timeout %d: give 0 to %d seconds", n, int64(maxTimeout/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

// egressOf maps E2B's network settings onto a den egress policy. As on
// E2B, nothing is denied unless denyOut (or allowInternetAccess false,
// which is denyOut 0.0.0.0/0) says so, and allowOut wins over denyOut:
// denyOut 0.0.0.0/0 is den's allow list (or deny-all), any other denyOut
// den's deny list with allowOut its exceptions. allowOut without denyOut
// changes nothing, and with a domain it is refused, as E2B refuses it.
// (E2B also refuses domains in allowOut beside a denyOut without
// 0.0.0.0/0; den takes them, as exceptions its resolver opens.)
func egressOf(b newSandbox) (string, error) {
	n := b.Network
	if n != nil && (len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null" || len(n.Rules) > 0 && string(n.Rules) != "null") {
		return "", errors.New("den does not support egress proxies or per-host rules: give allowOut and denyOut (den's egress policy)")
	}
	all := b.AllowInternetAccess != nil && !*b.AllowInternetAccess
	var allow, deny []string
	if n != nil {
		allow = n.AllowOut
		for _, d := range n.DenyOut {
			if d == "0.0.0.0/0" {
				all = true
			} else {
				deny = append(deny, d)
			}
		}
	}
	if len(deny) > 0 {
		// Each denyOut entry is checked, beside 0.0.0.0/0 too.
		if _, err := egress.Parse("deny:" + strings.Join(deny, ",")); err != nil {
			return "", err
		}
	}
	var policy string
	switch {
	case all && len(allow) > 0:
		policy = "allow:" + strings.Join(allow, ",")
	case all:
		policy = "deny-all"
	case len(deny) > 0 && len(allow) > 0:
		policy = "deny:" + strings.Join(deny, ",") + ";allow:" + strings.Join(allow, ",")
	case len(deny) > 0:
		policy = "deny:" + strings.Join(deny, ",")
	case len(allow) > 0:
		p, err := egress.Parse("allow:" + strings.Join(allow, ","))
		if err != nil {
			return "", err
		}
		if len(p.Domains) > 0 {
			return "", fmt.Errorf("allowOut names a domain (%s) but denyOut does not block all traffic: add 0.0.0.0/0 (ALL_TRAFFIC) to denyOut, or nothing is restricted", p.Domains[0])
		}
		return "", nil
	default:
		return "", nil
	}
	if _, err := egress.Parse(policy); err != nil {
		return "", err
	}
	return policy, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, c *caller) {
	var b newSandbox
	if err := decodeBody(r, &b, false); err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	if b.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "den: templateID is required: a den image name (base: the default image)")
		return
	}
	for what, raw := range map[string]json.RawMessage{"mcp": b.MCP, "iam": b.IAM, "volumeMounts": b.VolumeMounts} {
		if len(raw) > 0 && string(raw) != "null" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("den: %s is not supported by den's E2B API", what))
			return
		}
	}
	if b.AutoPauseMemory != nil && !*b.AutoPauseMemory {
		writeError(w, http.StatusBadRequest, "den: autoPauseMemory false is not supported: den's pause (den sleep) always keeps memory")
		return
	}
	timeout, err := timeoutOf(b.Timeout)
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	policy, err := egressOf(b)
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	image := ""
	srcVM, srcCP, fromSnapshot := parseSnapshot(b.TemplateID)
	if fromSnapshot {
		if _, ok := s.vmOf(w, r, c, srcVM, true); !ok {
			return
		}
	} else if b.TemplateID != DefaultTemplate {
		if err := validate.Image(b.TemplateID); err != nil {
			writeError(w, http.StatusBadRequest, "den: bad templateID: "+err.Error())
			return
		}
		image = b.TemplateID
	}
	for k := range b.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad envVars name %q", k))
			return
		}
	}
	id := newID()
	rec := record{Owner: c.user, Template: b.TemplateID, Metadata: b.Metadata, EnvVars: b.EnvVars,
		StartedAt: time.Now().UTC(), AutoPause: b.AutoPause, AutoResume: b.AutoResume != nil && b.AutoResume.Enabled, Making: true, Made: true}
	if b.Network != nil && b.Network.AllowPublicTraffic != nil && !*b.Network.AllowPublicTraffic {
		rec.TrafficToken = newToken()
	}
	rec.Egress = policy
	// The record comes first, so that a sandbox is never without one;
	// its timeout starts once it runs (the sweeper leaves it alone while
	// it is made).
	if err := s.recs.put(id, rec); err != nil {
		writeAPIError(w, err)
		return
	}
	if src, ok := s.recs.get(srcVM); fromSnapshot && ok {
		rec.Egress = src.Egress // a fork keeps its source's policy
	}
	var vm api.VM
	if fromSnapshot {
		if policy != "" {
			_ = s.recs.remove(id)
			writeError(w, http.StatusBadRequest, "den: a sandbox from a snapshot keeps its source's egress policy: network settings are not taken")
			return
		}
		vm, err = c.api.Fork(r.Context(), srcVM, api.ForkRequest{Checkpoint: srcCP, Name: id}, nil)
	} else {
		vm, err = c.api.CreateVM(r.Context(), api.CreateRequest{Name: id, Image: image, Egress: policy}, nil)
	}
	s.made(c, id, rec, vm, err, timeout)
	if err != nil {
		if errors.Is(err, api.ErrNotFound) && image != "" {
			writeError(w, http.StatusNotFound, fmt.Sprintf("den: template %q not found: a template is a den image name (den info shows the images; base is the default)", b.TemplateID))
			return
		}
		writeAPIError(w, err)
		return
	}
	s.log.Info("e2b: sandbox created", "sandbox", id, "user", c.user, "template", b.TemplateID, "timeout", timeout)
	writeJSON(w, http.StatusCreated, s.answer(id, rec, c))
}

// answer is what create, fork and connect answer of sandbox id.
func (s *Server) answer(id string, rec record, c *caller) sandbox {
	return sandbox{TemplateID: rec.Template, SandboxID: id, ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: c.key,
		Domain: s.cfg.Domain, TrafficAccessToken: rec.TrafficToken}
}

// newToken is a sandbox's traffic access token.
func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newID is a new sandbox id: a den VM name.
func newID() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 16)
	rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	b[0] = 'i'
	return string(b)
}

// vm is the caller's VM id, or an answer of 404 (also for another
// user's VM: no hint that it exists).
func (s *Server) vm(w http.ResponseWriter, r *http.Request, c *caller, id string) (api.VM, bool) {
	return s.vmOf(w, r, c, id, false)
}

// killed: sandbox id was killed and its VM stays for its snapshots.
func (s *Server) killed(id string) bool {
	rec, ok := s.recs.get(id)
	return ok && rec.Killed
}

// vmOf is vm, and with killed also a killed sandbox's VM (kept for its
// snapshots).
func (s *Server) vmOf(w http.ResponseWriter, r *http.Request, c *caller, id string, killed bool) (api.VM, bool) {
	notFound := func() {
		writeError(w, http.StatusNotFound, fmt.Sprintf("den: sandbox %q not found", id))
	}
	if validate.VMName(id) != nil {
		notFound()
		return api.VM{}, false
	}
	vm, err := c.api.GetVM(r.Context(), id)
	if errors.Is(err, api.ErrNotFound) || err == nil && (vm.Owner != c.user || !killed && s.killed(id)) {
		// The record stays: a not found may be another user's view.
		notFound()
		return api.VM{}, false
	}
	if err != nil {
		writeAPIError(w, err)
		return api.VM{}, false
	}
	return vm, true
}

// state is E2B's state of a den VM: paused when it sleeps, is stopped
// or was lost with its host.
func state(vm api.VM) string {
	switch vm.State {
	case "sleeping", "stopped", "lost":
		return "paused"
	}
	return "running"
}

func (s *Server) detail(vm api.VM, c *caller, withToken bool) sandboxDetail {
	d := sandboxDetail{TemplateID: vm.Image, SandboxID: vm.Name, ClientID: clientID, StartedAt: vm.CreatedAt.UTC(), EndAt: never,
		EnvdVersion: EnvdVersion, CPUCount: vm.CPUs, MemoryMB: vm.MemoryBytes >> 20, DiskSizeMB: vm.DiskBytes >> 20,
		Metadata: map[string]string{}, State: state(vm), Domain: s.cfg.Domain}
	if rec, ok := s.recs.get(vm.Name); ok {
		d.TemplateID, d.StartedAt = rec.Template, rec.StartedAt
		if !rec.EndAt.IsZero() {
			d.EndAt = rec.EndAt
		}
		if rec.Metadata != nil {
			d.Metadata = rec.Metadata
		}
		d.Lifecycle = &lifecycle{OnTimeout: "kill", AutoResume: rec.AutoResume}
		if rec.AutoPause {
			d.Lifecycle.OnTimeout = "pause"
		}
		d.Network = &networkDetail{AllowPublicTraffic: rec.TrafficToken == ""}
		if rec.Egress != "" {
			allow := rec.Egress != "deny-all"
			d.AllowInternet = &allow
		}
	}
	if withToken {
		d.EnvdAccessToken = c.key
	}
	return d
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, c *caller) {
	vm, ok := s.vm(w, r, c, r.PathValue("id"))
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, s.detail(vm, c, true))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return
	}
	keep, err := s.hasSnapshots(r.Context(), c.api, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if keep {
		if err := s.keepForSnapshots(r.Context(), c.api, vm); err != nil {
			writeAPIError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err := c.api.RemoveVM(r.Context(), id, true); err != nil {
		writeAPIError(w, err)
		return
	}
	s.dropSessions(id, true)
	s.logs.forget(id)
	if err := s.recs.remove(id); err != nil {
		s.log.Warn("e2b: kill: record", "sandbox", id, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// timeoutOf is the timeout a call gives in seconds, or the default.
func timeoutOf(secs *int64) (time.Duration, error) {
	if secs == nil {
		return defaultTimeout, nil
	}
	return seconds(*secs)
}

// made finishes the record of sandbox id once the making of its VM is
// over: with the VM's start and the timeout. When the making failed but
// the VM exists all the same (the daemon finishes a create or fork whose
// caller left), the record keeps it, with a timeout, so that it is not
// left forever; when there is no VM, the record goes.
func (s *Server) made(c *caller, id string, rec record, vm api.VM, err error, timeout time.Duration) {
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got, gerr := c.api.GetVM(ctx, id)
		if gerr != nil {
			_ = s.recs.remove(id)
			return
		}
		vm = got
		if timeout <= 0 {
			timeout = defaultTimeout
		}
	}
	s.logs.add(id, "info", fmt.Sprintf("made from %s (den vm on image %s, %d CPUs, %d MiB)", rec.Template, vm.Image, vm.CPUs, vm.MemoryBytes>>20),
		"template", rec.Template)
	rec.Making = false
	rec.StartedAt = vm.CreatedAt.UTC()
	rec.Timeout = timeout
	if timeout > 0 {
		rec.EndAt = time.Now().Add(timeout).UTC()
	}
	if err := s.recs.put(id, rec); err != nil {
		s.log.Warn("e2b: record of a sandbox made", "sandbox", id, "err", err)
	}
}

// ensureRecord gives a VM made outside E2B a record, so that a timeout
// can be kept for it.
func (s *Server) ensureRecord(vm api.VM) error {
	if _, ok := s.recs.get(vm.Name); ok {
		return nil
	}
	return s.recs.put(vm.Name, record{Owner: vm.Owner, Template: vm.Image, StartedAt: vm.CreatedAt.UTC()})
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, c *caller) {
	s.extend(w, r, c, "timeout", false)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request, c *caller) {
	s.extend(w, r, c, "duration", true)
}

// extend sets a sandbox's end to now plus the body's field (seconds);
// onlyLater keeps a later end.
func (s *Server) extend(w http.ResponseWriter, r *http.Request, c *caller, field string, onlyLater bool) {
	id := r.PathValue("id")
	var body map[string]json.RawMessage
	if err := decodeBody(r, &body, onlyLater); err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	var n int64
	if raw, ok := body[field]; ok {
		if err := json.Unmarshal(raw, &n); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("den: %s must be a whole number of seconds", field))
			return
		}
	} else if !onlyLater {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: %s (seconds) is required", field))
		return
	} else {
		n = int64(defaultTimeout / time.Second)
	}
	d, err := seconds(n)
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return
	}
	if err := s.ensureRecord(vm); err != nil {
		writeAPIError(w, err)
		return
	}
	end := time.Now().Add(d).UTC()
	if _, _, err := s.recs.update(id, func(rec *record) {
		if !onlyLater || end.After(rec.EndAt) {
			rec.EndAt = end
		}
		if !onlyLater {
			rec.Timeout = d
		}
	}); err != nil {
		writeAPIError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return
	}
	if state(vm) == "paused" {
		writeError(w, http.StatusConflict, fmt.Sprintf("den: sandbox %q is already paused", id))
		return
	}
	if _, err := c.api.Sleep(r.Context(), id, api.SleepRequest{Force: true}); err != nil {
		writeAPIError(w, err)
		return
	}
	s.dropSessions(id, false)
	s.logs.add(id, "info", "paused (den sleep: memory kept)")
	if err := s.ensureRecord(vm); err != nil {
		s.log.Warn("e2b: pause: record", "sandbox", id, "err", err)
	}
	s.paused(id)
	w.WriteHeader(http.StatusNoContent)
}

// resumeBody is the body of connect and resume.
type resumeBody struct {
	Timeout   *int64 `json:"timeout"`
	AutoPause *bool  `json:"autoPause"`
}

// wake brings a paused sandbox back (201) or finds it running (200),
// and moves its end to at least now plus the timeout asked.
func (s *Server) wake(w http.ResponseWriter, r *http.Request, c *caller, refuseRunning bool) {
	id := r.PathValue("id")
	var b resumeBody
	if err := decodeBody(r, &b, true); err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	d := 5 * time.Minute
	if b.Timeout != nil {
		var err error
		if d, err = seconds(*b.Timeout); err != nil {
			writeError(w, http.StatusBadRequest, "den: "+err.Error())
			return
		}
	}
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return
	}
	status := http.StatusOK
	if state(vm) == "paused" {
		if _, err := c.api.Wake(r.Context(), id); err != nil {
			writeAPIError(w, err)
			return
		}
		status = http.StatusCreated
		s.logs.add(id, "info", "resumed (den wake)")
	} else if refuseRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("den: sandbox %q is already running", id))
		return
	}
	if err := s.ensureRecord(vm); err != nil {
		writeAPIError(w, err)
		return
	}
	end := time.Now().Add(d).UTC()
	rec, _, err := s.recs.update(id, func(rec *record) {
		if end.After(rec.EndAt) {
			rec.EndAt = end
		}
		if b.AutoPause != nil {
			rec.AutoPause = *b.AutoPause
		}
		if b.Timeout != nil {
			rec.Timeout = d
		}
		rec.Paused = false
	})
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, status, s.answer(id, rec, c))
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request, c *caller) { s.wake(w, r, c, false) }
func (s *Server) resume(w http.ResponseWriter, r *http.Request, c *caller)  { s.wake(w, r, c, true) }

// listFilter is what a list call keeps.
type listFilter struct {
	states   []string
	metadata map[string]string
}

func (f listFilter) keeps(d sandboxDetail) bool {
	if len(f.states) > 0 && !slices.Contains(f.states, d.State) {
		return false
	}
	for k, v := range f.metadata {
		if d.Metadata[k] != v {
			return false
		}
	}
	return true
}

// parseFilter reads the state (comma-separated) and metadata (an
// encoded query string of key=value pairs) parameters.
func parseFilter(q url.Values) (listFilter, error) {
	var f listFilter
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return f, fmt.Errorf("bad state %q: running or paused", st)
			}
			f.states = append(f.states, st)
		}
	}
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return f, fmt.Errorf("bad metadata filter: %w", err)
		}
		f.metadata = map[string]string{}
		for k, vs := range pairs {
			f.metadata[k] = vs[len(vs)-1]
		}
	}
	return f, nil
}

// list is the caller's sandboxes that f keeps, oldest first.
func (s *Server) list(ctx context.Context, c *caller, f listFilter) ([]sandboxDetail, error) {
	vms, err := c.api.ListVMs(ctx)
	if err != nil {
		return nil, err
	}
	var out []sandboxDetail
	mine := map[string]bool{}
	for _, vm := range vms {
		if vm.Owner != c.user {
			continue
		}
		mine[vm.Name] = true
		if s.killed(vm.Name) {
			continue
		}
		if d := s.detail(vm, c, false); f.keeps(d) {
			out = append(out, d)
		}
	}
	// The caller's records of VMs gone by other ways (den rm) go; not
	// those of VMs being made.
	for id, rec := range s.recs.all() {
		if rec.Owner == c.user && !mine[id] && !(rec.Making && time.Since(rec.StartedAt) < makingGrace) {
			_ = s.recs.remove(id)
		}
	}
	slices.SortFunc(out, func(a, b sandboxDetail) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.SandboxID, b.SandboxID)
	})
	return out, nil
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request, c *caller) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	f.states = []string{"running"}
	out, err := s.list(r.Context(), c, f)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(out))
}

func (s *Server) listV2(w http.ResponseWriter, r *http.Request, c *caller) {
	q := r.URL.Query()
	f, err := parseFilter(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad limit %q: 1 to 100", v))
			return
		}
	}
	out, err := s.list(r.Context(), c, f)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if order := q.Get("order"); order == "desc" {
		slices.Reverse(out)
	}
	out, ok := page(w, q.Get("nextToken"), out, limit, func(d sandboxDetail) string { return d.SandboxID }, ": no such sandbox in this list")
	if ok {
		writeJSON(w, http.StatusOK, nonNil(out))
	}
}

// page is the page of out after the item whose id is next (from the
// start when next is ""), at most limit long, with the X-Next-Token
// header set when more follow; a next that is not in out is a 400
// (its message ends with why), and ok false.
func page[T any](w http.ResponseWriter, next string, out []T, limit int, id func(T) string, why string) (_ []T, ok bool) {
	if next != "" {
		i := slices.IndexFunc(out, func(x T) bool { return id(x) == next })
		if i < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad nextToken %q", next)+why)
			return nil, false
		}
		out = out[i+1:]
	}
	if len(out) > limit {
		out = out[:limit]
		w.Header().Set("X-Next-Token", id(out[limit-1]))
	}
	return out, true
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
