package e2b

import (
	"context"
	"errors"
	"time"

	"github.com/denhq/den/api"
)

// expire ends the sandboxes whose timeout has passed: each is killed,
// or put to sleep (den sleep, memory kept) when its lifecycle says
// pause. Paused sandboxes have no end.
func (s *Server) expire(ctx context.Context) {
	now := time.Now()
	for id, rec := range s.recs.all() {
		if rec.EndAt.IsZero() || rec.EndAt.After(now) {
			continue
		}
		s.end(ctx, id, rec)
	}
}

func (s *Server) end(ctx context.Context, id string, rec record) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cl := s.cfg.As(rec.Owner)
	defer cl.CloseIdle()
	vm, err := cl.GetVM(ctx, id)
	if errors.Is(err, api.ErrNotFound) {
		_ = s.recs.remove(id)
		return
	}
	if err != nil {
		s.log.Warn("e2b: timeout: vm", "sandbox", id, "err", err)
		return
	}
	if !sameVM(vm, rec) {
		// Another VM of the name (removed and made again outside E2B):
		// the record was the old one's.
		_ = s.recs.remove(id)
		return
	}
	if state(vm) == "paused" {
		s.clearEnd(id)
		return
	}
	if rec.AutoPause {
		s.log.Info("e2b: sandbox timed out: pausing", "sandbox", id)
		if _, err := cl.Sleep(ctx, id, api.SleepRequest{Force: true}); err != nil {
			s.log.Warn("e2b: timeout: sleep", "sandbox", id, "err", err)
			return
		}
		s.dropSessions(id, false)
		s.logs.add(id, "info", "timed out: paused (den sleep: memory kept)")
		s.paused(id)
		return
	}
	if keep, err := s.hasSnapshots(ctx, cl, id); err != nil || keep {
		if err == nil {
			s.log.Info("e2b: sandbox timed out: killing (its vm sleeps for its snapshots)", "sandbox", id)
			err = s.keepForSnapshots(ctx, cl, vm)
		}
		if err != nil {
			s.log.Warn("e2b: timeout: kill", "sandbox", id, "err", err)
		}
		return
	}
	s.log.Info("e2b: sandbox timed out: killing", "sandbox", id)
	if err := cl.RemoveVM(ctx, id, true); err != nil && !errors.Is(err, api.ErrNotFound) {
		s.log.Warn("e2b: timeout: kill", "sandbox", id, "err", err)
		return
	}
	s.dropSessions(id, true)
	s.logs.forget(id)
	_ = s.recs.remove(id)
}

// paused records that E2B paused sandbox id: no end, and (without
// autoResume) no envd until a connect.
func (s *Server) paused(id string) {
	if _, _, err := s.recs.update(id, func(r *record) { r.EndAt, r.Paused = time.Time{}, true }); err != nil {
		s.log.Warn("e2b: record", "sandbox", id, "err", err)
	}
}

// sameVM: rec is vm's record, not one left by an earlier VM of the name
// (removed and made again outside E2B).
func sameVM(vm api.VM, rec record) bool {
	d := vm.CreatedAt.Sub(rec.StartedAt)
	return rec.StartedAt.IsZero() || d <= time.Second && d >= -time.Second
}

func (s *Server) clearEnd(id string) {
	if _, _, err := s.recs.update(id, func(r *record) { r.EndAt = time.Time{} }); err != nil {
		s.log.Warn("e2b: record", "sandbox", id, "err", err)
	}
}
