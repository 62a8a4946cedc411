package daemon

import (
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/registry"
)

// The keys API: users' SSH public keys for the gateway. An admin sees
// and changes every user's keys; anyone else only their own.

func keyToAPI(k registry.Key) api.Key {
	return api.Key{Fingerprint: k.Fingerprint, User: k.User, Name: k.Name, PublicKey: k.PublicKey, CreatedAt: k.CreatedAt}
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.keys.List(r.Context(), owner(r))
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.Key, 0, len(keys))
	for _, k := range keys {
		out = append(out, keyToAPI(k))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) addKey(w http.ResponseWriter, r *http.Request) {
	var req api.AddKeyRequest
	if !decode(w, r, &req) {
		return
	}
	if err := forUser(r, "add key", req.User); err != nil {
		writeError(w, err)
		return
	}
	if owner(r) != "" {
		req.User = owner(r)
	}
	k, err := s.keys.Add(r.Context(), req.User, req.Name, []byte(req.PublicKey))
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("den: key added", "user", k.User, "key", k.Fingerprint, "name", k.Name)
	writeJSON(w, http.StatusCreated, keyToAPI(k))
}

func (s *Server) removeKey(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("ref")
	if ref == "" {
		writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: "missing ?ref=FINGERPRINT|NAME", Code: "invalid"})
		return
	}
	k, err := s.keys.Remove(r.Context(), owner(r), ref)
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("den: key removed", "user", k.User, "key", k.Fingerprint, "name", k.Name)
	writeJSON(w, http.StatusOK, keyToAPI(k))
}
