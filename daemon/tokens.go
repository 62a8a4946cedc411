package daemon

import (
	"fmt"
	"net/http"

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
	if !c.Admin {
		if req.Admin || (req.User != "" && req.User != c.User) {
			writeError(w, fmt.Errorf("add token: only an admin makes admin tokens or another user's: %w", api.ErrForbidden))
			return
		}
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
	s.log.Info("den: token removed", "user", t.User, "token", t.ID, "name", t.Name)
	writeJSON(w, http.StatusOK, tokenToAPI(t))
}
