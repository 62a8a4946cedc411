package e2b

import (
	"fmt"
	"net/http"
	"time"

	"github.com/denhq/den/api"
)

// maxForks caps the forks of one call: each is a VM with the source's
// memory.
const maxForks = 16

// forkBody is E2B's SandboxForkRequest.
type forkBody struct {
	Timeout *int64 `json:"timeout"`
	Count   *int   `json:"count"`
}

// forkResult is E2B's SandboxForkResult: a sandbox or an error.
type forkResult struct {
	Sandbox *sandbox  `json:"sandbox,omitempty"`
	Error   *apiError `json:"error,omitempty"`
}

// fork is den checkpoint (memory and disk, kept in the source's
// lineage) and count den forks of it: each fork a sandbox with the
// source's template, metadata and environment, its own hostname and
// address, and a timeout of its own.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	var b forkBody
	if err := decodeBody(r, &b, true); err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	count := 1
	if b.Count != nil {
		count = *b.Count
	}
	if count < 1 || count > maxForks {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad count %d: 1 to %d forks at a time", count, maxForks))
		return
	}
	timeout, err := timeoutOf(b.Timeout)
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return
	}
	if state(vm) == "paused" {
		writeError(w, http.StatusConflict, fmt.Sprintf("den: sandbox %q is paused: connect to it first", id))
		return
	}
	cp, err := c.api.Checkpoint(r.Context(), id, api.CheckpointRequest{Comment: fmt.Sprintf("%s x%d", forkComment, count)}, nil)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	src, _ := s.recs.get(id)
	if src.Template == "" {
		src.Template = vm.Image
	}
	out := make([]forkResult, 0, count)
	for range count {
		nid := newID()
		rec := record{Owner: c.user, Template: src.Template, Metadata: src.Metadata, EnvVars: src.EnvVars,
			StartedAt: time.Now().UTC(), AutoPause: src.AutoPause, AutoResume: src.AutoResume, Making: true, Made: true, Egress: src.Egress}
		if src.TrafficToken != "" {
			rec.TrafficToken = newToken()
		}
		if err := s.recs.put(nid, rec); err != nil {
			out = append(out, forkResult{Error: &apiError{Code: statusOf(err), Message: "den: " + err.Error()}})
			continue
		}
		fvm, err := c.api.Fork(r.Context(), id, api.ForkRequest{Checkpoint: cp.ID, Name: nid}, nil)
		s.made(c, nid, rec, fvm, err, timeout)
		if err != nil {
			out = append(out, forkResult{Error: &apiError{Code: statusOf(err), Message: "den: " + err.Error()}})
			continue
		}
		a := s.answer(nid, rec, c)
		out = append(out, forkResult{Sandbox: &a})
	}
	s.logs.add(id, "info", fmt.Sprintf("forked x%d at checkpoint %s", count, cp.ID), "checkpoint", cp.ID)
	s.log.Info("e2b: sandbox forked", "sandbox", id, "checkpoint", cp.ID, "count", count)
	writeJSON(w, http.StatusCreated, out)
}
