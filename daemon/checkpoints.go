package daemon

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// ownedRequest reads the JSON body into req and checks that the request's
// owner may use the VM of the path, answering the error itself; it
// returns the VM's name.
func (s *Server) ownedRequest(w http.ResponseWriter, r *http.Request, req any) (string, bool) {
	name := r.PathValue("name")
	return name, decode(w, r, req) && s.owned(w, r, name)
}

// decode reads a JSON body, answering 400 itself on failure.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: "bad request body: " + err.Error(), Code: "invalid"})
		return false
	}
	return true
}

func toAPICheckpoint(c registry.Checkpoint) api.Checkpoint {
	return api.Checkpoint{VM: c.VM, ID: c.ID, Parent: c.Parent, Kind: c.Kind, Comment: c.Comment,
		CreatedAt: c.CreatedAt, MemoryBytes: c.MemoryBytes, DiskBytes: c.DiskBytes}
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	cps, head, err := s.m.Checkpoints(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return
	}
	out := []api.Checkpoint{}
	for _, l := range checkpoint.Tree(cps) {
		c := toAPICheckpoint(l.Record)
		c.Tree, c.Depth, c.Head = l.Prefix, len([]rune(l.Prefix))/3, l.ID == head
		out = append(out, c)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) createCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		cp, err := s.m.Checkpoint(ctx, name, machine.CheckpointOptions{Comment: req.Comment, DiskOnly: req.DiskOnly, Keep: req.Keep}, progress)
		if err != nil {
			return api.Event{}, err
		}
		c := toAPICheckpoint(cp)
		c.Head = true
		return api.Event{Checkpoint: &c}, nil
	})
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	if err := s.m.DeleteCheckpoint(ctx, name, r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restore(w http.ResponseWriter, r *http.Request) {
	var req api.RestoreRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		saved, err := s.m.Restore(ctx, name, req.Checkpoint, machine.RestoreOptions{NoSave: req.NoSave, Force: req.Force}, progress)
		if saved != "" {
			progress("the state before the restore is checkpoint " + saved)
		}
		if err != nil {
			return api.Event{}, err
		}
		return s.vmEvent(ctx, name)
	})
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	src, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		vm, err := s.m.Fork(ctx, src, req.Checkpoint, req.Name, progress)
		if err != nil {
			return api.Event{}, err
		}
		return s.vmEvent(ctx, vm.Name)
	})
}

func (s *Server) sleep(w http.ResponseWriter, r *http.Request) {
	var req api.SleepRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	if err := s.m.Sleep(ctx, name, req.Force); err != nil {
		writeError(w, err)
		return
	}
	s.getVM(w, r)
}

func (s *Server) wake(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	if err := s.m.Wake(ctx, name); err != nil {
		writeError(w, err)
		return
	}
	s.getVM(w, r)
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
