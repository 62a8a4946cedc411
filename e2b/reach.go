package e2b

import (
	"fmt"
	"time"

	"github.com/denhq/den/api"
)

// pausedError: a request reached a sandbox that E2B paused and that was
// made without autoResume.
type pausedError struct{ id string }

func (e *pausedError) Error() string {
	return fmt.Sprintf("den: sandbox %s is paused: Sandbox.connect resumes it (it was made without autoResume)", e.id)
}

// reach lets a request through to sandbox vm (envd, a port), whose
// connection then wakes the VM. A sandbox E2B paused is refused unless
// it was made with autoResume; one that resumes so is given its timeout
// again. A VM that den's own idle sleep put to sleep, or that den woke
// by other means, is let through.
func (s *Server) reach(vm api.VM) error {
	rec, ok := s.recs.get(vm.Name)
	if !ok || !rec.Paused {
		return nil
	}
	if state(vm) == "paused" && !rec.AutoResume {
		return &pausedError{id: vm.Name}
	}
	_, _, err := s.recs.update(vm.Name, func(r *record) {
		r.Paused = false
		if r.EndAt.IsZero() && r.Timeout > 0 {
			r.EndAt = time.Now().Add(r.Timeout).UTC()
		}
	})
	if err == nil && state(vm) == "paused" {
		s.logs.add(vm.Name, "info", "reached while paused: resuming (autoResume)")
		s.log.Info("e2b: sandbox reached while paused: resuming (autoResume)", "sandbox", vm.Name)
	}
	return err
}
