package daemon

import (
	"context"
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/fsdiff"
	"github.com/denhq/den/machine"
)

// diff compares a checkpoint of the VM in the path with another
// checkpoint (of it or of another of the caller's VMs) or a current
// state, streaming progress; the final event carries the diff.
func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	var req api.DiffRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	toVM := req.ToVM
	if toVM == "" {
		toVM = name
	}
	if toVM != name && !s.owned(w, r, toVM) {
		return
	}
	prefix, _ := fsdiff.CleanPrefix(req.Path) // checked by decode
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		res, err := s.m.Diff(ctx, machine.DiffOptions{FromVM: name, From: req.From, ToVM: toVM, To: req.To,
			Options: fsdiff.Options{Prefix: prefix, Patch: req.Patch}}, progress)
		if err != nil {
			return api.Event{}, err
		}
		d := toAPIDiff(res.Result)
		d.FromVM, d.From, d.ToVM, d.To, d.Taken, d.Path = name, res.From, toVM, res.To, res.Taken, prefix
		return api.Event{Diff: &d}, nil
	})
}

func toAPIDiff(r fsdiff.Result) api.Diff {
	d := api.Diff{Changes: make([]api.DiffChange, 0, len(r.Changes)), Summary: api.DiffSummary(r.Summary)}
	for _, c := range r.Changes {
		d.Changes = append(d.Changes, api.DiffChange{Path: c.Path, Op: c.Op, Old: toAPIFile(c.Old), New: toAPIFile(c.New),
			What: c.What, LinkOf: c.LinkOf, MovedFrom: c.MovedFrom, Binary: c.Binary, Patch: c.Patch, NoPatch: c.NoPatch})
	}
	return d
}

func toAPIFile(f *fsdiff.File) *api.DiffFile {
	if f == nil {
		return nil
	}
	a := api.DiffFile(*f)
	return &a
}
