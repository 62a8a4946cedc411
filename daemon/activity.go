package daemon

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/api"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
)

// activityOf answers a VM's activity record.
func (s *Server) activityOf(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	f, err := activityFilter(r.URL.Query())
	if err != nil {
		writeError(w, fmt.Errorf("activity of vm %q: %w: %w", name, err, machine.ErrInvalid))
		return
	}
	entries, err := s.m.Activity(r.Context(), name, f)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.ActivityEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, api.ActivityEntry{N: e.N, Time: e.Time, Kind: e.Kind, PID: e.PID, PPID: e.PPID, UID: e.UID,
			Argv: e.Argv, ArgvTruncated: e.ArgvTruncated, Status: e.Status, Signal: e.Signal, Duration: e.Duration,
			Path: e.Path, Bytes: e.Bytes, Writes: e.Writes, Addr: e.Addr, Proto: e.Proto, Name: e.Name, Comm: e.Comm, Secret: e.Secret,
			Session: e.Session, Who: e.Who, Via: e.Via, Event: e.Event, Checkpoint: e.Checkpoint, From: e.From,
			Detail: e.Detail, Lost: e.Lost})
	}
	writeJSON(w, http.StatusOK, out)
}

// setActivityRecord switches a running VM's guest record on or off.
func (s *Server) setActivityRecord(w http.ResponseWriter, r *http.Request) {
	var req api.ActivityRecordRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	on, err := s.m.SetActivityRecord(r.Context(), name, req.On, whoOf(callerOf(r)))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ActivityRecordRequest{On: on})
}

// activityKinds are the kinds a filter may name.
var activityKinds = map[string]bool{activity.KindExec: true, activity.KindExit: true, activity.KindFile: true, activity.KindConnect: true, activity.KindSecret: true, activity.KindSession: true,
	activity.KindVM: true, activity.KindLost: true}

// activityFilter reads the query of an activity request.
func activityFilter(q url.Values) (activity.Filter, error) {
	var f activity.Filter
	var err error
	if id := q.Get("checkpoint"); id != "" {
		if err := checkpoint.ValidateID(id); err != nil {
			return f, err
		}
		f.Checkpoint = id
	}
	for _, t := range []struct {
		key string
		to  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.key); v != "" {
			if *t.to, err = time.Parse(time.RFC3339Nano, v); err != nil {
				return f, fmt.Errorf("%s: not an RFC 3339 time: %q", t.key, v)
			}
		}
	}
	if v := q.Get("kind"); v != "" {
		for _, k := range strings.Split(v, ",") {
			if !activityKinds[k] {
				return f, fmt.Errorf("kind: %q is none of exec, exit, file, session, vm, lost", k)
			}
			f.Kinds = append(f.Kinds, k)
		}
	}
	if f.Session = q.Get("session"); len(f.Session) > 64 {
		return f, fmt.Errorf("session: longer than 64 bytes")
	}
	if v := q.Get("after"); v != "" {
		if f.After, err = strconv.ParseUint(v, 10, 64); err != nil {
			return f, fmt.Errorf("after: not a number: %q", v)
		}
	}
	if v := q.Get("last"); v != "" {
		if f.Last, err = strconv.Atoi(v); err != nil || f.Last < 0 {
			return f, fmt.Errorf("last: not a count: %q", v)
		}
	}
	return f, nil
}
