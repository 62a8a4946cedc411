package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
)

// verifyCheckpoints reads checkpoints against their digests, streaming a
// line per checkpoint; the final event carries the results.
func (s *Server) verifyCheckpoints(w http.ResponseWriter, r *http.Request) {
	var req api.VerifyRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	s.stream(w, r, func(ctx context.Context, progress machine.Progress) (api.Event, error) {
		cps, head, err := s.m.Checkpoints(ctx, name)
		if err != nil {
			return api.Event{}, err
		}
		var ids []string
		switch {
		case req.All:
			for _, cp := range cps {
				ids = append(ids, cp.ID)
			}
		case req.Checkpoint != "":
			if err := checkpoint.ValidateID(req.Checkpoint); err != nil {
				return api.Event{}, err
			}
			ids = []string{req.Checkpoint}
		case head != "":
			ids = []string{head}
		default:
			return api.Event{}, fmt.Errorf("vm %q has no checkpoint to verify: %w", name, machine.ErrNotFound)
		}
		out := []api.Verification{}
		for _, id := range ids {
			res, err := s.m.VerifyCheckpoint(ctx, name, id, progress)
			v := api.Verification{Checkpoint: id, Status: "ok", Files: []api.VerifiedFile{}}
			switch {
			case errors.Is(err, checkpoint.ErrDamaged):
				v.Status, v.Error = "damaged", err.Error()
			case errors.Is(err, checkpoint.ErrUnsealed):
				v.Status, v.Error = "unsealed", err.Error()
			case err != nil:
				return api.Event{}, err
			}
			for _, f := range res {
				if f.Status == "unsealed" && v.Status == "ok" {
					v.Status = "unsealed"
				}
				v.Files = append(v.Files, api.VerifiedFile{File: f.File, Size: f.Size, Extents: f.Extents, Of: f.Of, Holes: f.Holes, ReadBytes: f.ReadBytes, Status: f.Status, Detail: f.Detail})
			}
			progress(fmt.Sprintf("%s: %s", id, v.Status))
			out = append(out, v)
		}
		return api.Event{Verified: out, Done: true}, nil
	})
}
