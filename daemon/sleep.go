package daemon

import (
	"context"
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
	s.tracedOp(w, r, name, "sleep", func(ctx context.Context) error { return s.m.Sleep(ctx, name, req.Force) })
}

func (s *Server) wake(w http.ResponseWriter, r *http.Request) {
	var req struct{} // no fields: any is refused
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	s.tracedOp(w, r, name, "wake", func(ctx context.Context) error { return s.m.Wake(ctx, name) })
}

// tracedOp runs op on vm name, its steps traced as what, and answers the
// VM or the error. The trace ends before the answer: a client reads it
// right after.
func (s *Server) tracedOp(w http.ResponseWriter, r *http.Request, name, what string, op func(context.Context) error) {
	ctx, cancel := opContext(r)
	defer cancel()
	ctx, done := s.trace(ctx, name, what)
	err := op(ctx)
	done()
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
