package e2b

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A sandbox's logs are what den's E2B server did with it: made, paused,
// resumed, timed out, forked, and each process started and ended (with
// its command, pid, user and exit status), as E2B's logs are envd's.
// They are kept in memory, up to maxLogs per sandbox, and go with the
// sandbox or a restart of the daemon; the guest's console is den logs
// ID.

// maxLogs caps the entries kept per sandbox.
const maxLogs = 1000

// logEntry is E2B's SandboxLogEntry.
type logEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLine is E2B's older SandboxLog.
type logLine struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// journal keeps the sandboxes' log entries.
type journal struct {
	mu sync.Mutex
	m  map[string][]logEntry
}

func newJournal() *journal { return &journal{m: map[string][]logEntry{}} }

// add logs msg for sandbox id; fields are pairs of key and value.
func (j *journal) add(id, level, msg string, fields ...string) {
	f := map[string]string{"sandboxID": id}
	for i := 0; i+1 < len(fields); i += 2 {
		f[fields[i]] = fields[i+1]
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	l := append(j.m[id], logEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Fields: f})
	if len(l) > maxLogs {
		l = slices.Clone(l[len(l)-maxLogs:])
	}
	j.m[id] = l
}

func (j *journal) forget(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.m, id)
}

func (j *journal) entries(id string) []logEntry {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.m[id])
}

func (s *Server) logRoutes() {
	s.mux.HandleFunc("GET /sandboxes/{id}/logs", s.authed(s.logsV1))
	s.mux.HandleFunc("GET /v2/sandboxes/{id}/logs", s.authed(s.logsV2))
}

// logQuery reads a time in milliseconds (start, cursor) and a limit.
func logQuery(r *http.Request, timeParam string) (time.Time, int, error) {
	var from time.Time
	if v := r.URL.Query().Get(timeParam); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return from, 0, fmt.Errorf("bad %s %q: milliseconds since 1970", timeParam, v)
		}
		from = time.UnixMilli(ms)
	}
	limit := maxLogs
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return from, 0, fmt.Errorf("bad limit %q", v)
		}
		limit = min(n, maxLogs)
	}
	return from, limit, nil
}

func (s *Server) logsV1(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	from, limit, err := logQuery(r, "start")
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	if _, ok := s.vm(w, r, c, id); !ok {
		return
	}
	out := struct {
		Logs       []logLine  `json:"logs"`
		LogEntries []logEntry `json:"logEntries"`
	}{Logs: []logLine{}, LogEntries: []logEntry{}}
	for _, e := range s.logs.entries(id) {
		if e.Timestamp.Before(from) || len(out.LogEntries) == limit {
			continue
		}
		out.LogEntries = append(out.LogEntries, e)
		out.Logs = append(out.Logs, logLine{Timestamp: e.Timestamp, Line: e.Message})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) logsV2(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	cursor, limit, err := logQuery(r, "cursor")
	if err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return
	}
	q := r.URL.Query()
	backward := false
	switch d := q.Get("direction"); d {
	case "", "forward":
	case "backward":
		backward = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad direction %q: forward or backward", d))
		return
	}
	level, search := q.Get("level"), q.Get("search")
	if _, ok := s.vm(w, r, c, id); !ok {
		return
	}
	entries := s.logs.entries(id)
	if backward {
		slices.Reverse(entries)
	}
	out := []logEntry{}
	for _, e := range entries {
		if len(out) == limit {
			break
		}
		if !cursor.IsZero() && (!backward && e.Timestamp.Before(cursor) || backward && e.Timestamp.After(cursor)) {
			continue
		}
		if level != "" && !atLeast(e.Level, level) || search != "" && !strings.Contains(e.Message, search) {
			continue
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, struct {
		Logs []logEntry `json:"logs"`
	}{out})
}

// atLeast: level is as severe as min or more.
func atLeast(level, min string) bool {
	rank := map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}
	return rank[level] >= rank[min]
}
