package daemon

import (
	"context"
	"fmt"
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/secrets"
)

// The checkpoints API: list, take, delete, restore and fork.

func toAPICheckpoint(c registry.Checkpoint) api.Checkpoint {
	return api.Checkpoint{VM: c.VM, ID: c.ID, Parent: c.Parent, Kind: c.Kind, Comment: c.Comment,
		CreatedAt: c.CreatedAt, MemoryBytes: c.MemoryBytes, DiskBytes: c.DiskBytes, Damaged: c.Damaged}
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
		ctx, done := s.trace(ctx, name, "checkpoint")
		defer done()
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
		ctx, done := s.trace(ctx, name, "restore")
		defer done()
		saved, err := s.m.Restore(ctx, name, req.Checkpoint, machine.RestoreOptions{NoSave: req.NoSave, Force: req.Force}, progress)
		if saved != "" {
			progress("the state before the restore is checkpoint " + saved)
		}
		if err != nil {
			return api.Event{}, err
		}
		ev, err := s.vmEvent(ctx, name)
		ev.Saved = saved
		return ev, err
	})
}

// restorePaths puts paths of the VM back from a checkpoint, in the
// running guest, streaming progress; the final event says what it did.
func (s *Server) restorePaths(w http.ResponseWriter, r *http.Request) {
	var req api.RestorePathsRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		ctx, done := s.trace(ctx, name, "restore paths")
		defer done()
		res, err := s.m.RestorePaths(ctx, machine.RestorePathsOptions{VM: name, Checkpoint: req.Checkpoint, Paths: req.Paths}, progress)
		if err != nil {
			return api.Event{}, err
		}
		out := &api.PathsRestored{Saved: res.Saved, Actions: make([]api.PathAction, 0, len(res.Actions))}
		for _, a := range res.Actions {
			out.Actions = append(out.Actions, api.PathAction(a))
		}
		return api.Event{PathsRestored: out}, nil
	})
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	src, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	// The source's grants are those of the VM checked now (a name can be
	// removed and taken again while the fork runs), and only the
	// caller's own secrets.
	var from secrets.VMRef
	if req.WithSecrets && s.secrets != nil {
		var err error
		if from, err = (secretsAPI{s}).vmRef(r, src); err != nil {
			writeError(w, err)
			return
		}
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		ctx, done := s.trace(ctx, req.Name, "fork")
		defer done()
		vm, err := s.m.Fork(ctx, src, req.Checkpoint, req.Name, progress)
		if err != nil {
			return api.Event{}, err
		}
		if from.Name != "" {
			if err := s.secrets.CopyGrants(from, secrets.VMRef{Name: vm.Name, Created: vm.CreatedAt}, callerOf(r).User); err != nil {
				return api.Event{}, fmt.Errorf("fork %q: give it %q's secrets: %w", vm.Name, src, err)
			}
			(secretsAPI{s}).pushSecrets(vm.Name)
		}
		return s.vmEvent(ctx, vm.Name)
	})
}
