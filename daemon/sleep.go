package daemon

import (
	"net/http"

	"github.com/denhq/den/api"
)

// Sleep and wake, and a disk's resize: operations on a VM's power and size.

func (s *Server) sleep(w http.ResponseWriter, r *http.Request) {
	var req api.SleepRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	ctx, done := s.trace(ctx, name, "sleep")
	err := s.m.Sleep(ctx, name, req.Force)
	done() // before the answer: a client reads the trace right after
	if err != nil {
		writeError(w, err)
		return
	}
	s.briefVM(w, r)
}

func (s *Server) wake(w http.ResponseWriter, r *http.Request) {
	var req struct{} // no fields: any is refused
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	ctx, done := s.trace(ctx, name, "wake")
	err := s.m.Wake(ctx, name)
	done() // before the answer: a client reads the trace right after
	if err != nil {
		writeError(w, err)
		return
	}
	s.briefVM(w, r)
}

func (s *Server) resize(w http.ResponseWriter, r *http.Request) {
	var req api.ResizeRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	if _, err := s.m.Resize(ctx, name, req.DiskBytes); err != nil {
		writeError(w, err)
		return
	}
	s.getVM(w, r)
}
