package daemon

import (
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/denhq/den/api"
	"github.com/denhq/den/registry"
)

// The tokens API: bearer tokens for the TLS listener. An admin sees and
// changes every user's tokens and may make admin tokens; anyone else only
// their own.

func tokenToAPI(t registry.Token) api.Token {
	return api.Token{ID: t.ID, User: t.User, Name: t.Name, Admin: t.Admin, CreatedAt: t.CreatedAt, LastUsed: t.LastUsed}
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	ts, err := s.tokens.List(r.Context(), owner(r))
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.Token, 0, len(ts))
	for _, t := range ts {
		out = append(out, tokenToAPI(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) addToken(w http.ResponseWriter, r *http.Request) {
	var req api.AddTokenRequest
	if !decode(w, r, &req) {
		return
	}
	c := callerOf(r)
	if !c.Admin && req.Admin {
		writeError(w, fmt.Errorf("add token: only an admin makes admin tokens: %w", api.ErrForbidden))
		return
	}
	if err := forUser(r, "add token", req.User); err != nil {
		writeError(w, err)
		return
	}
	if req.User == "" {
		req.User = c.User
	}
	secret, t, err := s.tokens.Create(r.Context(), req.User, req.Name, req.Admin)
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("den: token added", "user", t.User, "token", t.ID, "name", t.Name, "admin", t.Admin, "by", c.User)
	out := tokenToAPI(t)
	out.Secret = secret
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) removeToken(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("ref")
	if ref == "" {
		writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: "missing ?ref=ID|NAME", Code: "invalid"})
		return
	}
	t, err := s.tokens.Remove(r.Context(), owner(r), ref)
	if err != nil {
		writeError(w, err)
		return
	}
	n := s.held.cut(t.ID)
	s.log.Info("den: token removed", "user", t.User, "token", t.ID, "name", t.Name, "connections_closed", n)
	writeJSON(w, http.StatusOK, tokenToAPI(t))
}

// tokenConns are the connections that bearer tokens hold open (SSH
// upgrades: den ssh and den exec over TLS): revoking a token closes
// them, and a connection a revoked token would open is refused.
type tokenConns struct {
	mu      sync.Mutex
	open    map[string]map[net.Conn]struct{}
	revoked map[string]bool
}

// hold records c as held by token id; release forgets it. false: id was
// revoked (c is not held).
func (t *tokenConns) hold(id string, c net.Conn) (release func(), ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.revoked[id] {
		return nil, false
	}
	if t.open == nil {
		t.open = map[string]map[net.Conn]struct{}{}
	}
	if t.open[id] == nil {
		t.open[id] = map[net.Conn]struct{}{}
	}
	t.open[id][c] = struct{}{}
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.open[id], c)
		if len(t.open[id]) == 0 {
			delete(t.open, id)
		}
	}, true
}

// cut closes what token id holds and refuses what it would open; it
// returns how many connections it closed.
func (t *tokenConns) cut(id string) int {
	t.mu.Lock()
	if t.revoked == nil {
		t.revoked = map[string]bool{}
	}
	t.revoked[id] = true
	conns := t.open[id]
	delete(t.open, id)
	t.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	return len(conns)
}
