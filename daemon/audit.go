package daemon

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
)

// The audit log: one record per API call (written when its answer ends:
// a stream's or an SSH session's whole length) and per gateway session.

// statusRecorder keeps the status of an answer for the audit log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusRecorder) Flush() {
	if fl, ok := s.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := s.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("hijack: %w", http.ErrNotSupported)
	}
	if s.status == 0 {
		s.status = http.StatusSwitchingProtocols
	}
	return hj.Hijack()
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// auditCall records one API call.
func (s *Server) auditCall(c Caller, r *http.Request, status int, start time.Time) {
	verb := r.Pattern
	if verb == "" {
		verb = r.Method + " " + r.URL.Path
	}
	result := "ok"
	if status >= 300 && status != http.StatusSwitchingProtocols {
		result = strconv.Itoa(status) + " " + http.StatusText(status)
	}
	writeAudit(s.audit, s.log, audit.Record{Time: start.UTC(), User: c.User, Admin: c.Admin, Source: c.Source, Verb: verb,
		VM: r.PathValue("name"), Result: result, Status: status, Duration: time.Since(start)})
}

// writeAudit writes a record to l (if any), logging (not failing) when
// it cannot.
func writeAudit(l *audit.Log, log *slog.Logger, rec audit.Record) {
	if l == nil {
		return
	}
	if err := l.Write(rec); err != nil {
		log.Warn("den: audit log", "err", err)
	}
}

// exitResult is a den@ command's result for the audit log.
func exitResult(status int) string {
	if status == 0 {
		return "ok"
	}
	return "exit " + strconv.Itoa(status)
}

// getAudit answers the audit log: an admin's every record (or a user's,
// with ?user=), anyone else's own.
func (s *Server) getAudit(w http.ResponseWriter, r *http.Request) {
	if s.audit == nil {
		writeJSON(w, http.StatusOK, []api.AuditRecord{})
		return
	}
	q := r.URL.Query()
	f := audit.Filter{VM: q.Get("vm"), User: q.Get("user")}
	if err := forUser(r, "audit", f.User); err != nil {
		writeError(w, err)
		return
	}
	if c := callerOf(r); !c.Admin {
		f.User = c.User
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: fmt.Sprintf("bad since %q: want RFC 3339", v), Code: "invalid"})
			return
		}
		f.Since = t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: fmt.Sprintf("bad limit %q", v), Code: "invalid"})
			return
		}
		f.Limit = n
	}
	recs, err := s.audit.Query(f)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.AuditRecord, 0, len(recs))
	for _, rec := range recs {
		out = append(out, api.AuditRecord{Time: rec.Time, User: rec.User, Admin: rec.Admin, Source: rec.Source, Verb: rec.Verb,
			VM: rec.VM, Result: rec.Result, Status: rec.Status, DurationMS: float64(rec.Duration.Microseconds()) / 1000})
	}
	writeJSON(w, http.StatusOK, out)
}
