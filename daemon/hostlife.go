package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
)

// The host's life (api/hostlife.go): every VM put to sleep before the
// host shuts down (den sleep --all [--shutdown]), and woken after (den
// wake --all). Root's only.

// maxHostTimeout bounds what a request may ask for.
const maxHostTimeout = time.Hour

// maxHostParallel bounds how many VMs a request may handle at once.
const maxHostParallel = 64

func (s *Server) hostSleep(w http.ResponseWriter, r *http.Request) {
	if !rootOnly(w, r, "sleep --all") {
		return
	}
	var req api.HostSleepRequest
	if !decode(w, r, &req) {
		return
	}
	o, ok := hostOptions(w, req.Timeout, req.Parallel)
	if !ok {
		return
	}
	o.Shutdown, o.Force = req.Shutdown, req.Force
	s.log.Info("den: sleep --all asked", "shutdown", o.Shutdown, "timeout", o.Timeout, "parallel", o.Parallel)
	s.hostStream(w, r, func(ctx context.Context, report func(machine.HostResult)) ([]machine.HostResult, error) {
		return s.m.SleepAll(ctx, o, report)
	})
}

func (s *Server) hostWake(w http.ResponseWriter, r *http.Request) {
	if !rootOnly(w, r, "wake --all") {
		return
	}
	var req api.HostWakeRequest
	if !decode(w, r, &req) {
		return
	}
	o, ok := hostOptions(w, req.Timeout, req.Parallel)
	if !ok {
		return
	}
	s.hostStream(w, r, func(ctx context.Context, report func(machine.HostResult)) ([]machine.HostResult, error) {
		return s.m.WakeAll(ctx, o, report)
	})
}

// rootOnly refuses (403) a request made for one user: what the host's
// life does reaches every user's VMs.
func rootOnly(w http.ResponseWriter, r *http.Request, what string) bool {
	if owner(r) == "" {
		return true
	}
	writeJSON(w, http.StatusForbidden, api.ErrorBody{Code: "forbidden",
		Error: fmt.Sprintf("%s acts on every user's vms: an admin's (root or --admin-group; user %q is not)", what, owner(r))})
	return false
}

// hostOptions checks a request's timeout and parallelism, answering 400
// itself when they are bad.
func hostOptions(w http.ResponseWriter, timeout string, parallel int) (machine.HostOptions, bool) {
	var o machine.HostOptions
	bad := func(format string, a ...any) (machine.HostOptions, bool) {
		writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: fmt.Sprintf(format, a...), Code: "invalid"})
		return o, false
	}
	if timeout != "" {
		d, err := time.ParseDuration(timeout)
		if err != nil || d <= 0 || d > maxHostTimeout {
			return bad("bad timeout %q: use a duration like 2m, at most %s", timeout, maxHostTimeout)
		}
		o.Timeout = d
	}
	if parallel < 0 || parallel > maxHostParallel {
		return bad("bad parallel %d: use 1 to %d (0: the default, %d)", parallel, maxHostParallel, machine.DefaultHostParallel)
	}
	o.Parallel = parallel
	return o.WithDefaults(), true
}

// hostStream runs a sleep or wake of every VM, detached from the request
// (a host shutdown goes on if its client is killed), streaming each VM's
// result and then the summary.
func (s *Server) hostStream(w http.ResponseWriter, r *http.Request, op func(context.Context, func(machine.HostResult)) ([]machine.HostResult, error)) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	start := time.Now()
	var mu sync.Mutex
	emit := func(ev api.HostEvent) {
		mu.Lock()
		defer mu.Unlock()
		ev.Elapsed = time.Since(start).Round(time.Millisecond).String()
		_ = enc.Encode(ev)
		if fl != nil {
			fl.Flush()
		}
	}
	ctx := context.WithoutCancel(r.Context())
	res, err := op(ctx, func(hr machine.HostResult) {
		v := hostVM(hr)
		emit(api.HostEvent{Result: &v})
	})
	if err != nil {
		emit(api.HostEvent{Error: err.Error(), Code: errorCode(err), Done: true})
		return
	}
	sum := api.HostSummary{VMs: []api.HostVM{}, Failed: []string{}, TookMS: time.Since(start).Milliseconds()}
	for _, hr := range res {
		v := hostVM(hr)
		sum.VMs = append(sum.VMs, v)
		if !v.OK {
			sum.Failed = append(sum.Failed, v.Name)
		}
	}
	emit(api.HostEvent{Summary: &sum, Done: true})
}

func hostVM(r machine.HostResult) api.HostVM {
	v := api.HostVM{Name: r.Name, OK: r.Err == nil, State: string(r.State), Reason: r.Reason, TookMS: r.Took.Milliseconds()}
	if r.Err != nil {
		v.Error, v.Code = r.Err.Error(), errorCode(r.Err)
	}
	return v
}
