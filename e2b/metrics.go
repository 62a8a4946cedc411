package e2b

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// metricsWindow is how long a metrics call measures a sandbox's CPU
// over: den keeps no history of it, so a call answers with one sample
// taken now.
const metricsWindow = 250 * time.Millisecond

// maxMetricsIDs bounds the sandboxes one /sandboxes/metrics call names.
const maxMetricsIDs = 100

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

func (s *Server) metricsRoutes() {
	s.mux.HandleFunc("GET /sandboxes/{id}/metrics", s.authed(s.metrics))
	s.mux.HandleFunc("GET /sandboxes/metrics", s.authed(s.metricsOf))
}

// metrics answers one sandbox's metrics: a sample taken now when it
// runs and now lies in the asked interval, else none (a paused sandbox
// uses no CPU and holds no memory).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, c *caller) {
	from, to, err := interval(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	vm, ok := s.vm(w, r, c, r.PathValue("id"))
	if !ok {
		return
	}
	out := []sandboxMetric{}
	if now := time.Now().Unix(); vm.State == "running" && (from == 0 || now >= from) && (to == 0 || now <= to) {
		m, err := sample(r.Context(), c.api, vm)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
}

// metricsOf answers the metrics of the running sandboxes among
// sandbox_ids that are the caller's, sampled together.
func (s *Server) metricsOf(w http.ResponseWriter, r *http.Request, c *caller) {
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 || len(ids) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: sandbox_ids names 1 to %d sandboxes, comma-separated", maxMetricsIDs))
		return
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]sandboxMetric{}
	)
	for _, id := range ids {
		if validate.VMName(id) != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			vm, err := c.api.GetVM(r.Context(), id)
			if err != nil || vm.Owner != c.user || vm.State != "running" {
				return // not found, another's, or paused: no metrics
			}
			if m, err := sample(r.Context(), c.api, vm); err == nil {
				mu.Lock()
				out[id] = m
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// interval reads the start and end query parameters (Unix seconds; 0
// when absent).
func interval(r *http.Request) (from, to int64, err error) {
	for _, p := range []struct {
		name string
		v    *int64
	}{{"start", &from}, {"end", &to}} {
		q := r.URL.Query().Get(p.name)
		if q == "" {
			continue
		}
		if *p.v, err = strconv.ParseInt(q, 10, 64); err != nil || *p.v < 0 {
			return 0, 0, fmt.Errorf("%s=%q is not a Unix time in seconds", p.name, q)
		}
	}
	if to != 0 && from > to {
		return 0, 0, fmt.Errorf("start %d is after end %d", from, to)
	}
	return from, to, nil
}

// sample measures a running VM now: its VMM cgroup's CPU time over
// metricsWindow against its CPUs, the memory its cgroup holds against
// the VM's, its disk's data against its size. Without a cgroup (VMMs not
// confined) CPU and memory read 0.
func sample(ctx context.Context, c *api.Client, vm api.VM) (sandboxMetric, error) {
	t0 := time.Now()
	timer := time.NewTimer(metricsWindow)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return sandboxMetric{}, ctx.Err()
	case <-timer.C:
	}
	now, err := c.GetVM(ctx, vm.Name)
	if err != nil {
		return sandboxMetric{}, err
	}
	m := sandboxMetric{
		CPUCount: now.CPUs, MemTotal: now.MemoryBytes, DiskUsed: now.DiskUsed, DiskTotal: now.DiskBytes,
	}
	at := time.Now().UTC()
	m.Timestamp, m.TimestampUnix = at.Format(time.RFC3339Nano), at.Unix()
	if now.Cgroup != nil {
		m.MemUsed = min(now.Cgroup.MemoryCurrent, now.MemoryBytes)
		if vm.Cgroup != nil && now.CPUs > 0 {
			used := now.Cgroup.CPUSeconds - vm.Cgroup.CPUSeconds
			m.CPUUsedPct = max(0, min(100, used/time.Since(t0).Seconds()/float64(now.CPUs)*100))
		}
	}
	return m, nil
}
