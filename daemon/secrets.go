package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
		Created: s.Created, Updated: s.Updated}
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
	if req.Kind != secrets.KindSSH {
		writeError(w, fmt.Errorf("add secret %q: kind %q: den keeps ssh secrets: %w", req.Name, req.Kind, machine.ErrInvalid))
		return
	}
	c := callerOf(r)
	sec, err := a.secrets.AddSSH(c.User, req.Name, []byte(req.Value), req.KnownHosts)
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
	a.grantsOf(w, vm)
}

// keyAgents serves den's SSH secrets to each VM's guest agent
// connection: machine.Config.OnAgent.
type keyAgents struct {
	store *secrets.Store
	log   *slog.Logger
	// m and audit are set once the daemon has them; until then a VM's
	// requests find no grants.
	m     atomic.Pointer[machine.Manager]
	audit atomic.Pointer[audit.Log]

	mu      sync.Mutex
	refused map[string]*refusals // by VM
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
			ref := secrets.VMRef{Name: vm}
			if m := k.m.Load(); m != nil {
				if rec, err := m.Record(context.Background(), vm); err == nil {
					ref.Created = rec.CreatedAt
				}
			}
			note := func(u secrets.Use) {
				if u.Err != nil {
					ok, more := k.counted(vm)
					if !ok {
						return
					}
					if more > 0 {
						u.Err = fmt.Errorf("%w (and %d more refused since the last such entry)", u.Err, more)
					}
				}
				k.note(u)
				e := activity.Entry{Kind: activity.KindSecret, Secret: u.Secret, Detail: "ssh signature for " + u.Dest}
				if u.Err != nil {
					e.Detail = "refused: " + u.Err.Error()
				}
				record(e)
			}
			if err := k.store.ServeSSHAgent(rw, ref, note); err != nil && err != io.EOF {
				k.log.Debug("den: ssh agent for a vm ended", "vm", vm, "err", err)
			}
		})
		if err != nil {
			k.log.Debug("den: no ssh agent for the vm's guest", "vm", vm, "err", err)
		}
	}()
}

// note writes a use of a secret to the audit log.
func (k *keyAgents) note(u secrets.Use) {
	result := "ok: signed for " + u.Dest
	if u.Err != nil {
		result = u.Err.Error()
	}
	k.log.Info("den: secret used", "vm", u.VM, "secret", u.Secret, "dest", u.Dest, "result", result)
	if a := k.audit.Load(); a != nil {
		_ = a.Write(audit.Record{User: u.Owner, Source: "vm " + u.VM + " ssh agent", Verb: "secret " + u.Secret + " ssh sign", VM: u.VM, Result: result})
	}
}
