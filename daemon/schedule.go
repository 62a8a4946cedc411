package daemon

import (
	"fmt"
	"net/http"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
)

// getSchedule answers a VM's checkpoint schedule.
func (s *Server) getSchedule(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	sc, err := s.m.GetSchedule(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, scheduleInfo(name, sc))
}

// setSchedule sets or removes a VM's checkpoint schedule.
func (s *Server) setSchedule(w http.ResponseWriter, r *http.Request) {
	var req api.ScheduleRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	var want *machine.Schedule
	if !req.Off {
		every, err := time.ParseDuration(req.Every)
		if err != nil {
			writeError(w, fmt.Errorf("schedule: every %q is not a duration (10m, 1h): %w", req.Every, machine.ErrInvalid))
			return
		}
		want = &machine.Schedule{Every: every, Keep: req.Keep, KeepDaily: req.KeepDaily, DiskOnly: req.DiskOnly}
	}
	sc, err := s.m.SetSchedule(r.Context(), name, want)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, scheduleInfo(name, sc))
}

func scheduleInfo(name string, sc *machine.Schedule) api.ScheduleInfo {
	out := api.ScheduleInfo{Name: name}
	if sc != nil {
		taken := make([]string, 0, len(sc.Taken))
		for _, t := range sc.Taken {
			taken = append(taken, t.ID)
		}
		out.Schedule = &api.Schedule{Every: sc.Every.String(), Keep: sc.Keep, KeepDaily: sc.KeepDaily, DiskOnly: sc.DiskOnly, Taken: taken, Last: sc.Last}
	}
	return out
}
