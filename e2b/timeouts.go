package e2b

import (
	"context"
	"errors"
	"time"

	"github.com/denhq/den/api"
)

// expire ends the sandboxes whose timeout has passed: each is killed,
// or put to sleep (den sleep, memory kept) when its lifecycle says
// pause (onTimeout). Sandboxes E2B paused have no end.
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
	switch action := onTimeout(rec, state(vm) == "paused"); action {
	case noEnd:
		s.clearEnd(id)
		return
	case pause, pauseAsleep:
		how := "it slept already"
		if action == pause {
			s.log.Info("e2b: sandbox timed out: pausing", "sandbox", id)
			if _, err := cl.Sleep(ctx, id, api.SleepRequest{Force: true}); err != nil {
				s.log.Warn("e2b: timeout: sleep", "sandbox", id, "err", err)
				return
			}
			how = "den sleep"
		} else {
			s.log.Info("e2b: sandbox timed out: paused (den's idle sleep had put it to sleep)", "sandbox", id)
		}
		s.dropSessions(id, false)
		s.logs.add(id, "info", "timed out: paused ("+how+": memory kept)")
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

// What a sandbox's timeout does.
type timeoutAction int

const (
	kill        timeoutAction = iota // kill it (its vm sleeps on when it has snapshots)
	pause                            // put it to sleep, as E2B paused
	pauseAsleep                      // record it as E2B paused: den's idle sleep put it to sleep already
	noEnd                            // nothing: E2B paused it, and a paused sandbox has no end
)

// onTimeout is what rec's timeout does to its sandbox, asleep or not. A
// sandbox that den's idle sleep (not E2B) put to sleep is running as E2B
// sees it: its timeout kills or pauses it all the same.
func onTimeout(rec record, asleep bool) timeoutAction {
	switch {
	case asleep && rec.Paused:
		return noEnd
	case rec.AutoPause && asleep:
		return pauseAsleep
	case rec.AutoPause:
		return pause
	}
	return kill
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
