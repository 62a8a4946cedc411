package daemon

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/phase"
)

// traces keeps the steps of each VM's last operation (den bench
// --breakdown reads them), in memory only.
type traces struct {
	mu   sync.Mutex
	last map[string]api.Trace
}

// trace records the steps of operation op on VM name under ctx; done
// keeps them as the VM's last.
func (s *Server) trace(ctx context.Context, name, op string) (context.Context, func()) {
	rec := phase.New()
	started := time.Now().UTC()
	return phase.With(ctx, rec), func() {
		t := api.Trace{VM: name, Op: op, Started: started, TotalMS: ms(rec.Total())}
		for _, st := range rec.Steps() {
			t.Steps = append(t.Steps, api.TraceStep{Name: st.Name, AtMS: ms(st.At), MS: ms(st.Took)})
		}
		s.traces.mu.Lock()
		defer s.traces.mu.Unlock()
		if s.traces.last == nil {
			s.traces.last = map[string]api.Trace{}
		}
		s.traces.last[name] = t
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// getTrace answers the steps of the VM's last operation.
func (s *Server) getTrace(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	s.traces.mu.Lock()
	t, ok := s.traces.last[name]
	s.traces.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, api.ErrorBody{Error: "no operation of vm " + name + " traced since the daemon started", Code: "not_found"})
		return
	}
	writeJSON(w, http.StatusOK, t)
}
