package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// An E2B snapshot is a den checkpoint (memory and disk) of a sandbox;
// its id is SANDBOX@CHECKPOINT ("ibox@cp-3"), which create takes as a
// template (a den fork of that checkpoint) and DELETE /templates/ID
// deletes. As on E2B, snapshots outlive their sandbox: a sandbox killed
// while it has any keeps its VM asleep (den ls shows it; E2B calls do
// not), and deleting its last snapshot removes the VM. The checkpoints
// a fork takes are not snapshots.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// defaultSnapshotComment marks a checkpoint made by a snapshot call
// without a name.
const defaultSnapshotComment = "e2b snapshot"

// parseSnapshot splits a snapshot id; ok is false when id is not one.
func parseSnapshot(id string) (vm, cp string, ok bool) {
	vm, cp, ok = strings.Cut(id, "@")
	if !ok || validate.VMName(vm) != nil || validate.CheckpointID(cp) != nil {
		return "", "", false
	}
	return vm, cp, true
}

func infoOf(cp api.Checkpoint) snapshotInfo {
	names := []string{}
	if cp.Comment != "" && cp.Comment != defaultSnapshotComment {
		names = append(names, cp.Comment)
	}
	return snapshotInfo{SnapshotID: cp.VM + "@" + cp.ID, Names: names}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	var b struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &b, true); err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	if len(b.Name) > 200 || strings.ContainsAny(b.Name, "\x00\n") {
		writeError(w, http.StatusBadRequest, "den: bad snapshot name: at most 200 characters on one line")
		return
	}
	if strings.HasPrefix(b.Name, forkComment) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad snapshot name %q: names starting %q mark the checkpoints forks take", b.Name, forkComment))
		return
	}
	if _, ok := s.vm(w, r, c, id); !ok {
		return
	}
	comment := b.Name
	if comment == "" {
		comment = defaultSnapshotComment
	}
	cp, err := c.api.Checkpoint(r.Context(), id, api.CheckpointRequest{Comment: comment}, nil)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, infoOf(cp))
}

// snapshots are the checkpoints of the caller's sandboxes (of one when
// sandbox is set), by id.
func (s *Server) snapshots(ctx context.Context, c *caller, sandbox string) ([]snapshotInfo, error) {
	var names []string
	if sandbox != "" {
		vm, err := c.api.GetVM(ctx, sandbox)
		if errors.Is(err, api.ErrNotFound) || err == nil && vm.Owner != c.user {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		names = []string{sandbox}
	} else {
		vms, err := c.api.ListVMs(ctx)
		if err != nil {
			return nil, err
		}
		for _, vm := range vms {
			if vm.Owner == c.user {
				names = append(names, vm.Name)
			}
		}
	}
	var out []snapshotInfo
	for _, name := range names {
		cps, err := c.api.Checkpoints(ctx, name)
		if errors.Is(err, api.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, cp := range cps {
			out = append(out, infoOf(cp))
		}
	}
	slices.SortFunc(out, func(a, b snapshotInfo) int { return strings.Compare(a.SnapshotID, b.SnapshotID) })
	return out, nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, c *caller) {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		var err error
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad limit %q: 1 to 100", v))
			return
		}
	}
	all, err := s.snapshots(r.Context(), c, q.Get("sandboxID"))
	if err != nil {
		writeAPIError(w, err)
		return
	}
	out := all[:0:0]
	for _, sn := range all {
		if name := q.Get("name"); name == "" || slices.Contains(sn.Names, name) {
			out = append(out, sn)
		}
	}
	out, ok := page(w, q.Get("nextToken"), out, limit, func(sn snapshotInfo) string { return sn.SnapshotID }, "")
	if ok {
		writeJSON(w, http.StatusOK, nonNil(out))
	}
}

// deleteTemplate deletes a snapshot; den has no other templates to
// delete.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, c *caller) {
	vm, cp, ok := parseSnapshot(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotImplemented, "den: templates are den images, not deleted through the E2B API; a snapshot id is SANDBOX@CHECKPOINT")
		return
	}
	if _, ok := s.vmOf(w, r, c, vm, true); !ok {
		return
	}
	if err := c.api.DeleteCheckpoint(r.Context(), vm, cp); err != nil {
		writeAPIError(w, err)
		return
	}
	if s.killed(vm) {
		if left, err := s.hasSnapshots(r.Context(), c.api, vm); err == nil && !left {
			if err := c.api.RemoveVM(r.Context(), vm, true); err != nil {
				s.log.Warn("e2b: the vm of a killed sandbox without snapshots", "sandbox", vm, "err", err)
			} else {
				_ = s.recs.remove(vm)
				s.logs.forget(vm)
			}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkComment starts the comment of the checkpoint a fork takes.
const forkComment = "e2b fork"

// hasSnapshots: sandbox id has checkpoints other than those forks took.
func (s *Server) hasSnapshots(ctx context.Context, cl *api.Client, id string) (bool, error) {
	cps, err := cl.Checkpoints(ctx, id)
	if err != nil {
		return false, err
	}
	for _, cp := range cps {
		if !strings.HasPrefix(cp.Comment, forkComment) {
			return true, nil
		}
	}
	return false, nil
}

// keepForSnapshots kills a sandbox that has snapshots: its VM goes to
// sleep and its record says killed.
func (s *Server) keepForSnapshots(ctx context.Context, cl *api.Client, vm api.VM) error {
	if state(vm) != "paused" {
		if _, err := cl.Sleep(ctx, vm.Name, api.SleepRequest{Force: true}); err != nil {
			return err
		}
	}
	s.dropSessions(vm.Name, true)
	s.logs.forget(vm.Name)
	if err := s.ensureRecord(vm); err != nil {
		return err
	}
	if _, _, err := s.recs.update(vm.Name, func(r *record) { r.Killed, r.Paused, r.EndAt = true, false, time.Time{} }); err != nil {
		return err
	}
	s.log.Info("e2b: sandbox killed; its vm sleeps for its snapshots", "sandbox", vm.Name)
	return nil
}
