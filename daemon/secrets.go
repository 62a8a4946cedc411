package daemon

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/agent"
	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/secrets"
)

// The secrets API: each user's secrets (never their values in an
// answer) and the VMs they are granted to. A user's secrets are their
// own, an admin's too.

func secretToAPI(s secrets.Secret) api.Secret {
	return api.Secret{Name: s.Name, Owner: s.Owner, Kind: s.Kind, Hosts: s.Hosts, HostKeys: s.HostKeys, PublicKey: s.PublicKey,
		Header: s.Header, Query: s.Query, Env: s.Env, Created: s.Created, Updated: s.Updated}
}

// secretsAPI serves the secrets routes (a view of the Server).
type secretsAPI struct{ *Server }

// onSecrets makes a route of a secretsAPI handler.
func onSecrets(h func(secretsAPI, http.ResponseWriter, *http.Request)) func(*Server, http.ResponseWriter, *http.Request) {
	return func(s *Server, w http.ResponseWriter, r *http.Request) { h(secretsAPI{s}, w, r) }
}

// secretsOff answers when the daemon keeps no secrets.
func (a secretsAPI) off(w http.ResponseWriter) bool {
	if a.secrets == nil {
		writeError(w, fmt.Errorf("this daemon keeps no secrets: %w", machine.ErrConflict))
		return true
	}
	return false
}

func (a secretsAPI) listSecrets(w http.ResponseWriter, r *http.Request) {
	if a.off(w) {
		return
	}
	l, err := a.secrets.List(callerOf(r).User)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.Secret, 0, len(l))
	for _, sec := range l {
		out = append(out, secretToAPI(sec))
	}
	writeJSON(w, http.StatusOK, out)
}

func (a secretsAPI) addSecret(w http.ResponseWriter, r *http.Request) {
	var req api.AddSecretRequest
	if !decode(w, r, &req) || a.off(w) {
		return
	}
	c := callerOf(r)
	var sec secrets.Secret
	var err error
	switch req.Kind {
	case secrets.KindSSH:
		sec, err = a.secrets.AddSSH(c.User, req.Name, []byte(req.Value), req.KnownHosts)
	case secrets.KindHTTPS:
		sec, err = a.secrets.AddHTTPS(c.User, req.Name, []byte(req.Value),
			secrets.HTTPS{Hosts: req.Hosts, Header: req.Header, Query: req.Query, Env: req.Env})
	default:
		err = fmt.Errorf("add secret %q: kind %q: den keeps ssh and https secrets: %w", req.Name, req.Kind, machine.ErrInvalid)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	a.log.Info("den: secret added", "user", c.User, "secret", sec.Name, "kind", sec.Kind, "hosts", sec.Hosts)
	writeJSON(w, http.StatusCreated, secretToAPI(sec))
}

func (a secretsAPI) setSecret(w http.ResponseWriter, r *http.Request) {
	var req api.SetSecretRequest
	if !decode(w, r, &req) || a.off(w) {
		return
	}
	c := callerOf(r)
	sec, err := a.secrets.Set(c.User, r.PathValue("secret"), []byte(req.Value))
	if err != nil {
		writeError(w, err)
		return
	}
	a.log.Info("den: secret set", "user", c.User, "secret", sec.Name)
	writeJSON(w, http.StatusOK, secretToAPI(sec))
}

func (a secretsAPI) removeSecret(w http.ResponseWriter, r *http.Request) {
	if a.off(w) {
		return
	}
	c := callerOf(r)
	sec, err := a.secrets.Get(c.User, r.PathValue("secret"))
	if err == nil {
		err = a.secrets.Remove(c.User, sec.Name)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	a.log.Info("den: secret removed", "user", c.User, "secret", sec.Name)
	writeJSON(w, http.StatusOK, secretToAPI(sec))
}

// vmRef is the VM a grant names, its name and when it was made, read in
// one go with its owner: the request's owner must be it (a name removed
// and taken again by another user since an earlier check is refused).
func (a secretsAPI) vmRef(r *http.Request, name string) (secrets.VMRef, error) {
	rec, err := a.m.Record(r.Context(), name)
	if err != nil {
		return secrets.VMRef{}, err
	}
	if owner(r) != "" && rec.Owner != owner(r) {
		return secrets.VMRef{}, fmt.Errorf("no vm named %q: %w", name, machine.ErrNotFound)
	}
	return secrets.VMRef{Name: rec.Name, Created: rec.CreatedAt}, nil
}

// pushSecrets gives a running VM's guest its HTTPS secrets' new
// placeholders (the interceptor reads the grants at every request: the
// change counts there already).
func (a secretsAPI) pushSecrets(vm string) {
	if a.keyAgents != nil {
		a.keyAgents.push(vm)
	}
}

// grantsOf answers a VM's grants: its secrets' names.
func (a secretsAPI) grantsOf(w http.ResponseWriter, vm secrets.VMRef) {
	gs, err := a.secrets.Grants(vm)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]string, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.Secret)
	}
	writeJSON(w, http.StatusOK, out)
}

// target is the VM of a grants request, answering the error itself.
func (a secretsAPI) target(w http.ResponseWriter, r *http.Request) (secrets.VMRef, bool) {
	vm, err := a.vmRef(r, r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return vm, false
	}
	return vm, !a.off(w)
}

func (a secretsAPI) vmSecrets(w http.ResponseWriter, r *http.Request) {
	if vm, ok := a.target(w, r); ok {
		a.grantsOf(w, vm)
	}
}

func (a secretsAPI) grantSecret(w http.ResponseWriter, r *http.Request) {
	var req api.GrantRequest
	if !decode(w, r, &req) {
		return
	}
	vm, ok := a.target(w, r)
	if !ok {
		return
	}
	c := callerOf(r)
	if err := a.secrets.Grant(c.User, req.Secret, vm); err != nil {
		writeError(w, err)
		return
	}
	a.log.Info("den: secret granted", "user", c.User, "secret", req.Secret, "vm", vm.Name)
	a.pushSecrets(vm.Name)
	a.grantsOf(w, vm)
}

func (a secretsAPI) revokeSecret(w http.ResponseWriter, r *http.Request) {
	vm, ok := a.target(w, r)
	if !ok {
		return
	}
	c := callerOf(r)
	secret := r.PathValue("secret")
	had, err := a.secrets.Revoke(c.User, secret, vm)
	if err != nil {
		writeError(w, err)
		return
	}
	if !had {
		writeError(w, fmt.Errorf("vm %q has no grant of secret %q: %w", vm.Name, secret, machine.ErrNotFound))
		return
	}
	a.log.Info("den: secret revoked", "user", c.User, "secret", secret, "vm", vm.Name)
	a.pushSecrets(vm.Name)
	a.grantsOf(w, vm)
}

// keyAgents serves den's secrets to the VMs: SSH signatures to each
// guest agent connection (machine.Config.OnAgent), HTTPS secrets'
// placeholders and CA to the newest one, and the uses of both to the
// audit log and the VMs' activity records.
type keyAgents struct {
	store *secrets.Store
	log   *slog.Logger
	// m and audit are set once the daemon has them; until then a VM's
	// requests find no grants.
	m     atomic.Pointer[machine.Manager]
	audit atomic.Pointer[audit.Log]

	mu      sync.Mutex
	refused map[string]*refusals // by VM
	// conns are each VM's newest agent connection and where its activity
	// record is written.
	conns map[string]agentConn
}

// agentConn is a VM's agent connection and its activity record.
type agentConn struct {
	c      *agent.Client
	record func(activity.Entry)
}

// refusals are a VM's refused signatures since its last one recorded:
// a guest asking in a loop writes an entry per refusedEvery at most.
type refusals struct {
	at time.Time
	n  int
}

const (
	refusedEvery = 10 * time.Second
	// maxKeyChannels bounds the agent connections a guest has open at
	// once on one agent connection.
	maxKeyChannels = 16
)

// counted says whether a refusal for vm is recorded, and how many went
// unrecorded before it.
func (k *keyAgents) counted(vm string) (bool, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.refused == nil {
		k.refused = map[string]*refusals{}
	}
	now := time.Now()
	r := k.refused[vm]
	if r != nil && now.Sub(r.at) < refusedEvery {
		r.n++
		return false, 0
	}
	more := 0
	if r != nil {
		more = r.n
	}
	k.refused[vm] = &refusals{at: now}
	return true, more
}

// onAgent serves vm's key channels on c, in the background; each use of
// a secret goes to the audit log and, through record, the VM's activity
// record.
func (k *keyAgents) onAgent(vm string, c *agent.Client, record func(activity.Entry)) {
	k.mu.Lock()
	if k.conns == nil {
		k.conns = map[string]agentConn{}
	}
	k.conns[vm] = agentConn{c: c, record: record}
	k.mu.Unlock()
	// Only where HTTPS secrets are in use: a request at every connection
	// costs a guest under emulation enough to slow what it runs then.
	if k.store.AnyHTTPS() {
		go k.push(vm)
	}
	sem := make(chan struct{}, maxKeyChannels)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := c.ServeKeyAgent(ctx, func(rw io.ReadWriter) {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			default:
				return // too many open: this one is closed
			}
			// No record, no grant: a VM whose record cannot be read
			// finds nothing (a grant names a creation time).
			ref, _ := k.vmRef(vm)
			note := func(u secrets.Use) { k.used(u, record) }
			if err := k.store.ServeSSHAgent(rw, ref, note); err != nil && err != io.EOF {
				k.log.Debug("den: ssh agent for a vm ended", "vm", vm, "err", err)
			}
		})
		if err != nil {
			k.log.Debug("den: no ssh agent for the vm's guest", "vm", vm, "err", err)
		}
	}()
}

// secretRoots are the authorities den trusts for HTTPS secrets' hosts:
// the system's, and those of file (if not "").
func secretRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("secrets ca: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("secrets ca: no PEM certificate in %s", file)
	}
	return pool, nil
}

// vmRef is a VM's identity for its grants: its name and when it was
// made.
func (k *keyAgents) vmRef(vm string) (secrets.VMRef, error) {
	ref := secrets.VMRef{Name: vm}
	m := k.m.Load()
	if m == nil {
		return ref, fmt.Errorf("vm %q: the daemon is starting", vm)
	}
	rec, err := m.Record(context.Background(), vm)
	if err != nil {
		return ref, err
	}
	ref.Created = rec.CreatedAt
	return ref, nil
}

// push gives vm's newest agent connection its HTTPS secrets'
// placeholders and, when it has any, its CA.
func (k *keyAgents) push(vm string) {
	k.mu.Lock()
	conn, ok := k.conns[vm]
	k.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-conn.c.Done():
		k.mu.Lock()
		if k.conns[vm].c == conn.c {
			delete(k.conns, vm)
		}
		k.mu.Unlock()
		return
	default:
	}
	ref, err := k.vmRef(vm)
	if err != nil {
		return
	}
	granted, err := k.store.GrantedHTTPS(ref)
	if err != nil {
		k.log.Warn("den: https secrets of a vm", "vm", vm, "err", err)
		return
	}
	req := agent.SecretsRequest{Env: []string{}}
	for _, sec := range granted {
		req.Env = append(req.Env, sec.Env+"="+secrets.Placeholder(sec.Name))
	}
	if len(granted) > 0 {
		ca, err := k.store.VMCA(ref)
		if err != nil {
			k.log.Warn("den: https secrets of a vm", "vm", vm, "err", err)
			return
		}
		req.CA = string(ca.PEM)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.c.SetSecrets(ctx, req); err != nil {
		k.log.Warn("den: https secrets not given to the vm's guest", "vm", vm, "err", err)
	}
}

// forget drops what is kept of a removed VM.
func (k *keyAgents) forget(vm string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.conns, vm)
	delete(k.refused, vm)
}

// usedHTTPS notes a use of an HTTPS secret (secrets.InterceptorConfig.Note).
func (k *keyAgents) usedHTTPS(u secrets.Use) {
	k.mu.Lock()
	conn := k.conns[u.VM]
	k.mu.Unlock()
	k.used(u, conn.record)
}

// used notes a use of a secret in the audit log and, through record (if
// not nil), the VM's activity record; refusals at most once per VM per
// refusedEvery, with a count of those left out.
func (k *keyAgents) used(u secrets.Use, record func(activity.Entry)) {
	if u.Err != nil {
		ok, more := k.counted(u.VM)
		if !ok {
			return
		}
		if more > 0 {
			u.Err = fmt.Errorf("%w (and %d more refused since the last such entry)", u.Err, more)
		}
	}
	result, source, verb := "ok: signed for "+u.Dest, "vm "+u.VM+" ssh agent", "secret "+u.Secret+" ssh sign"
	detail := "ssh signature for " + u.Dest
	if u.Kind == secrets.KindHTTPS {
		result, source, verb = "ok: "+u.Dest, "vm "+u.VM+" https", "secret "+u.Secret+" https"
		detail = "https " + u.Dest
	}
	if u.Err != nil {
		result = u.Err.Error()
		detail = "refused: " + result
		if u.Kind == secrets.KindHTTPS {
			detail = "https " + u.Dest + ": " + result
		}
	}
	k.log.Info("den: secret used", "vm", u.VM, "secret", u.Secret, "dest", u.Dest, "result", result)
	if a := k.audit.Load(); a != nil {
		_ = a.Write(audit.Record{User: u.Owner, Source: source, Verb: verb, VM: u.VM, Result: result})
	}
	if record != nil {
		record(activity.Entry{Kind: activity.KindSecret, Secret: u.Secret, Detail: detail})
	}
}
