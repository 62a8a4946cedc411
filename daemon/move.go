package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// move moves a VM to another host of the cluster: put to sleep here, where
// it runs (a request for a VM another host runs was forwarded there), then
// woken by the target host, whose wake brings its memory, processes and
// disk from the shared volume. A VM that runs nowhere is only woken there.
func (s *Server) move(w http.ResponseWriter, r *http.Request) {
	var req api.MoveRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	if s.peers == nil {
		writeError(w, fmt.Errorf("move vm %q: this host is not one of a cluster whose hosts reach each other (den daemon --cluster, with address and ca_cert): %w", name, machine.ErrConflict))
		return
	}
	self := s.peers.cred.Host()
	ctx, cancel := opContext(r)
	defer cancel()
	if err := s.peers.alive(ctx, req.To); err != nil {
		writeError(w, fmt.Errorf("move vm %q: %w", name, err))
		return
	}
	start := time.Now()
	res := api.MoveResult{To: req.To}
	st, err := s.m.Brief(ctx, name)
	if err != nil {
		writeError(w, err)
		return
	}
	if st.State == registry.StateRunning && st.PID != 0 {
		if req.To == self {
			writeError(w, fmt.Errorf("move vm %q: it runs on host %q already: %w", name, self, machine.ErrConflict))
			return
		}
		res.From = self
		t := time.Now()
		if err := s.m.Sleep(ctx, name, req.Force); err != nil {
			writeError(w, fmt.Errorf("move vm %q: sleep on host %q: %w", name, self, err))
			return
		}
		// This host keeps the VM's lease until the digests of its
		// memory are written: another host wakes it only then.
		if err := s.peers.released(ctx, name); err != nil {
			writeError(w, fmt.Errorf("move vm %q: %w", name, err))
			return
		}
		res.SleepMS = time.Since(t).Milliseconds()
	}
	t := time.Now()
	var vm api.VM
	if req.To == self {
		if err = s.m.Wake(ctx, name); err == nil {
			var st machine.Status
			if st, err = s.m.Get(ctx, name); err == nil {
				vm = toAPI(st)
			}
		}
	} else {
		var cl *api.Client
		if cl, err = s.peers.client(ctx, req.To, callerOf(r)); err == nil {
			vm, err = cl.Wake(ctx, name)
		}
	}
	if err != nil {
		var held *machine.HeldError
		if errors.As(err, &held) {
			err = fmt.Errorf("%w (something reached it first)", err)
		}
		writeError(w, fmt.Errorf("move vm %q: wake on host %q: %w", name, req.To, err))
		return
	}
	res.WakeMS, res.TotalMS, res.VM = time.Since(t).Milliseconds(), time.Since(start).Milliseconds(), vm
	writeJSON(w, http.StatusOK, res)
}
