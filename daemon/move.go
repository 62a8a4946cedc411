package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// move moves a VM to another host of the cluster (moveVM); a request for
// a VM another host runs was forwarded there.
func (s *Server) move(w http.ResponseWriter, r *http.Request) {
	var req api.MoveRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	if s.peers == nil {
		writeError(w, fmt.Errorf("move vm %q: %w", name, errNoPeers))
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	res, err := s.moveVM(ctx, name, req, callerOf(r))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// errNoPeers refuses what needs the other hosts of a cluster.
var errNoPeers = fmt.Errorf("this host is not one of a cluster whose hosts reach each other (den daemon --cluster, with address and ca_cert): %w", machine.ErrConflict)

// moveVM puts the VM to sleep here, where it runs, then has the target
// host wake it, whose wake brings its memory, processes and disk from
// the shared volume. A VM that runs nowhere is only woken there.
func (s *Server) moveVM(ctx context.Context, name string, req api.MoveRequest, c Caller) (api.MoveResult, error) {
	self := s.peers.cred.Host()
	if _, err := s.peers.alive(ctx, req.To); err != nil {
		return api.MoveResult{}, fmt.Errorf("move vm %q: %w", name, err)
	}
	start := time.Now()
	res := api.MoveResult{To: req.To}
	st, err := s.m.Brief(ctx, name)
	if err != nil {
		return api.MoveResult{}, err
	}
	// A host that cannot restore the VM's memory is refused before the
	// VM sleeps.
	if err := s.peers.restores(ctx, req.To, name); err != nil {
		return api.MoveResult{}, fmt.Errorf("move vm %q: %w", name, err)
	}
	if st.State == registry.StateRunning && st.PID != 0 {
		if req.To == self {
			return api.MoveResult{}, fmt.Errorf("move vm %q: it runs on host %q already: %w", name, self, machine.ErrConflict)
		}
		res.From = self
		t := time.Now()
		if err := s.m.Sleep(ctx, name, req.Force); err != nil {
			return api.MoveResult{}, fmt.Errorf("move vm %q: sleep on host %q: %w", name, self, err)
		}
		// This host keeps the VM's lease until the digests of its
		// memory are written: another host wakes it only then.
		if err := s.peers.released(ctx, name); err != nil {
			return api.MoveResult{}, fmt.Errorf("move vm %q: %w", name, err)
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
		if cl, err = s.peers.client(ctx, req.To, c); err == nil {
			vm, err = cl.Wake(ctx, name)
			cl.CloseIdle()
		}
	}
	if err != nil {
		var held *machine.HeldError
		if errors.As(err, &held) {
			err = fmt.Errorf("%w (something reached it first)", err)
		}
		return api.MoveResult{}, fmt.Errorf("move vm %q: wake on host %q: %w", name, req.To, err)
	}
	res.WakeMS, res.TotalMS, res.VM = time.Since(t).Milliseconds(), time.Since(start).Milliseconds(), vm
	return res, nil
}

// drainHost marks a host of the cluster draining, so that it admits no
// new VMs (creates and wakes go to other hosts), and moves its running
// VMs to the other live hosts, each to the one with the most free
// memory budget then (api.DrainRequest.Undo admits VMs again). A
// request for another host is forwarded to it.
func (s *Server) drainHost(w http.ResponseWriter, r *http.Request) {
	if !rootOnly(w, r, "hosts drain") {
		return
	}
	host := r.PathValue("host")
	if err := validate.HostName(host); err != nil {
		writeError(w, err)
		return
	}
	if s.peers == nil {
		writeError(w, fmt.Errorf("drain host %q: %w", host, errNoPeers))
		return
	}
	if host != s.peers.cred.Host() {
		if forwardedBy(r.Context()) != "" {
			writeError(w, fmt.Errorf("drain host %q: forwarded to host %q: %w", host, s.peers.cred.Host(), machine.ErrConflict))
			return
		}
		if _, err := s.peers.alive(r.Context(), host); err != nil {
			writeError(w, fmt.Errorf("drain host %q: %w", host, err))
			return
		}
		s.peers.forward(w, r, host, "", callerOf(r)) // the body unread: it goes along
		return
	}
	var req api.DrainRequest
	if !decode(w, r, &req) {
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	h, err := s.peers.hosts.SetDraining(ctx, host, !req.Undo)
	if err != nil {
		writeError(w, err)
		return
	}
	res := api.DrainResult{Host: host, Draining: h.Draining, Moved: []api.MoveResult{}, Failed: []api.DrainFailure{}}
	if req.Undo {
		writeJSON(w, http.StatusOK, res)
		return
	}
	vms, err := s.m.List(ctx, "")
	if err != nil {
		writeError(w, err)
		return
	}
	for _, st := range vms {
		if st.State != registry.StateRunning || st.PID == 0 {
			continue
		}
		need, err := s.peers.m.Need(ctx, st.Name)
		var to string
		if err == nil {
			to, err = s.peers.place(ctx, &need)
		}
		if err == nil {
			var mv api.MoveResult
			if mv, err = s.moveVM(ctx, st.Name, api.MoveRequest{To: to, Force: req.Force}, callerOf(r)); err == nil {
				res.Moved = append(res.Moved, mv)
				continue
			}
		}
		res.Failed = append(res.Failed, api.DrainFailure{VM: st.Name, Error: err.Error()})
	}
	writeJSON(w, http.StatusOK, res)
}
