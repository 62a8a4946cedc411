package daemon

import (
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/memstore"
)

// getStorage answers what the caller's VMs' memory snapshots take in the
// memory store, with the store's totals.
func (s *Server) getStorage(w http.ResponseWriter, r *http.Request) {
	rep, err := s.m.StorageUsage(r.Context(), owner(r))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, storageOf(rep))
}

// collectGarbage collects the memory store: an admin's, as it acts on
// every user's snapshots.
func (s *Server) collectGarbage(w http.ResponseWriter, r *http.Request) {
	if !rootOnly(w, r, "gc") {
		return
	}
	var req api.GCRequest
	if !decode(w, r, &req) {
		return
	}
	got, err := s.m.CollectGarbage(r.Context(), req.DryRun)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.GCResult{Manifests: got.Manifests, Packs: got.Packs, Garbage: got.Garbage, Bytes: got.Bytes,
		Repacked: got.Repacked, Moved: got.Moved, Freed: got.Freed, Young: got.Young, Removed: got.Removed, Temporary: got.Temporary, DryRun: got.DryRun})
}

func usageOf(u memstore.Usage) api.Usage {
	return api.Usage{Referenced: u.Referenced, Unique: u.Unique, Shared: u.Shared}
}

func storageOf(rep machine.StorageReport) api.Storage {
	out := api.Storage{Stored: rep.Stored, Live: rep.Live, Garbage: rep.Garbage, Packs: rep.Packs, Bases: usageOf(rep.Bases), VMs: []api.VMStorage{}, Disk: rep.Disk}
	for _, vm := range rep.VMs {
		v := api.VMStorage{Name: vm.Name, Referenced: vm.Referenced, Unique: vm.Unique, Shared: vm.Shared, Disk: usageOf(vm.Disk)}
		for _, cp := range vm.Checkpoints {
			v.Checkpoints = append(v.Checkpoints, api.CheckpointStorage{ID: cp.ID, Referenced: cp.Referenced, Frees: cp.Frees, DiskFrees: cp.DiskFrees})
		}
		out.VMs = append(out.VMs, v)
	}
	return out
}
