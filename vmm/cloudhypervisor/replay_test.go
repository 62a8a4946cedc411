package cloudhypervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The replay server answers API requests with the responses recorded in
// testdata/*.jsonl (real Cloud Hypervisor transcripts).
//
// A transcript is cut into segments, one per VMM process: each ends with
// PUT vmm.shutdown. A replay serves one segment (plus, where a test says
// so, extra recorded entries): a request gets the first unused entry with
// its method and path whose recorded body is compatible with the
// request's (see bodyMatches), so the entries for one endpoint are served
// in their recorded order. GET vmm.ping is always answered with the
// recorded ping. A request with no such entry gets a 500 whose message
// starts with "replay:", and is noted as unexpected.

// entry is one recorded request and its response.
type entry struct {
	Method     string          `json:"method"`
	Path       string          `json:"path"`
	Body       json.RawMessage `json:"body,omitempty"`
	Status     int             `json:"status"`
	RespBody   json.RawMessage `json:"resp_body,omitempty"`
	RecordedAt int             `json:"line"`
}

func (e entry) key() string { return e.Method + " " + e.Path }

// loadTranscript reads the request/response lines of a transcript file;
// other lines (vsock probes, directory listings) are skipped.
func loadTranscript(path string) ([]entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var rec struct {
			Request *struct {
				Method string          `json:"method"`
				Path   string          `json:"path"`
				Body   json.RawMessage `json:"body"`
			} `json:"request"`
			Response *struct {
				Status int             `json:"status"`
				Body   json.RawMessage `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if rec.Request == nil || rec.Response == nil {
			continue
		}
		out = append(out, entry{
			Method: rec.Request.Method, Path: rec.Request.Path, Body: rec.Request.Body,
			Status: rec.Response.Status, RespBody: rec.Response.Body, RecordedAt: line,
		})
	}
	return out, sc.Err()
}

// segments cuts a transcript into VMM lifetimes, each ending with
// PUT vmm.shutdown.
func segments(es []entry) [][]entry {
	var out [][]entry
	var cur []entry
	for _, e := range es {
		cur = append(cur, e)
		if e.key() == "PUT /api/v1/vmm.shutdown" {
			out = append(out, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// Names of the transcripts and what their segments show.
const (
	mainTranscript = "testdata/api-transcript.jsonl"
	snapTranscript = "testdata/api-transcript-snapshot.jsonl"
)

// segment returns segment i of a transcript in testdata.
func segment(t testing.TB, file string, i int) []entry {
	t.Helper()
	es, err := loadTranscript(file)
	if err != nil {
		t.Fatal(err)
	}
	segs := segments(es)
	if i >= len(segs) {
		t.Fatalf("%s has %d segments, want segment %d", file, len(segs), i)
	}
	return segs[i]
}

// recorded returns the first recorded entry of a transcript with the
// given method, path and status.
func recorded(t testing.TB, file, key string, status int) entry {
	t.Helper()
	es, err := loadTranscript(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.key() == key && e.Status == status {
			return e
		}
	}
	t.Fatalf("%s has no %s answered %d", file, key, status)
	return entry{}
}

// request is what the replay server received.
type request struct {
	Method, Path string
	Body         []byte
}

func (r request) key() string { return r.Method + " " + r.Path }

// replay is an http.Handler answering from recorded entries.
type replay struct {
	ping entry

	mu         sync.Mutex
	entries    []entry
	used       []bool
	got        []request
	unexpected []string

	// crashOn: a request with this key is never answered; crash runs
	// instead (the fake process exits there).
	crashOn string
	crash   func()
	// afterShutdown runs once vmm.shutdown has been answered.
	afterShutdown func()
	// handlers answer the requests of their key ("PUT /api/v1/vm.x")
	// instead of recorded entries: for endpoints no transcript has.
	handlers map[string]http.HandlerFunc
}

func newReplay(ping entry, entries []entry) *replay {
	return &replay{ping: ping, entries: entries, used: make([]bool, len(entries))}
}

func (r *replay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	got := request{Method: req.Method, Path: req.URL.Path, Body: body}
	if got.key() == r.crashOn && r.crash != nil {
		r.crash()
		return
	}
	r.mu.Lock()
	r.got = append(r.got, got)
	if h := r.handlers[got.key()]; h != nil {
		r.mu.Unlock()
		req.Body = io.NopCloser(bytes.NewReader(body))
		h(w, req)
		return
	}
	e, ok := r.match(got)
	if !ok {
		r.unexpected = append(r.unexpected, got.key())
	}
	r.mu.Unlock()
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		msg, _ := json.Marshal([]string{"replay: no recorded response for " + got.key(), string(body)})
		w.Write(msg)
		return
	}
	if len(e.RespBody) > 0 && string(e.RespBody) != "null" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(e.RespBody)))
		w.WriteHeader(e.Status)
		w.Write(e.RespBody)
	} else {
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(e.Status)
	}
	if e.key() == "PUT /api/v1/vmm.shutdown" && r.afterShutdown != nil {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		go func() {
			time.Sleep(20 * time.Millisecond) // let the answer go out
			r.afterShutdown()
		}()
	}
}

// match picks the entry for a request; the caller holds r.mu.
func (r *replay) match(got request) (entry, bool) {
	if got.key() == r.ping.key() {
		return r.ping, true
	}
	var gotBody any
	if len(bytes.TrimSpace(got.Body)) > 0 {
		if err := decodeJSON(got.Body, &gotBody); err != nil {
			return entry{}, false
		}
	}
	for i, e := range r.entries {
		if r.used[i] || e.key() != got.key() {
			continue
		}
		var recBody any
		if len(e.Body) > 0 {
			if err := decodeJSON(e.Body, &recBody); err != nil {
				continue
			}
		}
		if bodyMatches(recBody, gotBody) {
			r.used[i] = true
			return e, true
		}
	}
	return entry{}, false
}

// requests returns what the server received, in order.
func (r *replay) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.got...)
}

// last returns the body of the last request with this key.
func (r *replay) last(t testing.TB, key string) map[string]any {
	t.Helper()
	reqs := r.requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].key() == key {
			var m map[string]any
			if err := decodeJSON(reqs[i].Body, &m); err != nil {
				t.Fatalf("%s body: %v", key, err)
			}
			return m
		}
	}
	t.Fatalf("no %s request was received", key)
	return nil
}

// unused lists the recorded entries no request matched.
func (r *replay) unused() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for i, e := range r.entries {
		if !r.used[i] && e.key() != r.ping.key() {
			out = append(out, fmt.Sprintf("%s (line %d)", e.key(), e.RecordedAt))
		}
	}
	return out
}

func (r *replay) unexpectedRequests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.unexpected...)
}

func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}

// bodyMatches reports whether a request body fits a recorded one. Every
// value the recording has must be in the request, equal, except that
// strings holding a '/' (host paths, file:// URLs, rewritten when the
// transcript was recorded and different in every test) match any string,
// and that a zero recorded value (false, 0, "") may be absent, as Go's
// omitempty leaves it out. Extra request fields are allowed.
func bodyMatches(rec, got any) bool {
	switch r := rec.(type) {
	case nil:
		return true
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, rv := range r {
			gv, present := g[k]
			if !present {
				if !isZero(rv) {
					return false
				}
				continue
			}
			if !bodyMatches(rv, gv) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(r) {
			return false
		}
		for i := range r {
			if !bodyMatches(r[i], g[i]) {
				return false
			}
		}
		return true
	case string:
		g, ok := got.(string)
		if !ok {
			return false
		}
		return g == r || strings.Contains(r, "/")
	case json.Number:
		g, ok := got.(json.Number)
		return ok && g.String() == r.String()
	default:
		return rec == got
	}
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case json.Number:
		return x.String() == "0"
	default:
		return false
	}
}

// pingEntry is the recorded vmm.ping.
func pingEntry(t testing.TB) entry {
	return recorded(t, mainTranscript, "GET /api/v1/vmm.ping", 200)
}

// info404 is the recorded vm.info of a VMM without a VM; Restore asks it
// first, and one recorded segment (prefault, then restore) lacks it.
func info404(t testing.TB) entry {
	return recorded(t, snapTranscript, "GET /api/v1/vm.info", 404)
}

// serveReplay serves r on a unix socket until the returned stop is called.
func serveReplay(sock string, r *replay) (stop func(), err error) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "replay:", err)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Close()
			<-done
			os.Remove(sock)
		})
	}
	return stop, nil
}

// startReplay serves entries on dir's API socket for the test's duration;
// like Cloud Hypervisor, it stops listening after vmm.shutdown.
func startReplay(t *testing.T, sock string, entries ...entry) *replay {
	t.Helper()
	r := newReplay(pingEntry(t), entries)
	stop, err := serveReplay(sock, r)
	if err != nil {
		t.Fatal(err)
	}
	r.afterShutdown = stop
	t.Cleanup(stop)
	return r
}

// shortDir is a fresh directory with a short path (unix socket paths are
// limited to 107 bytes; t.TempDir's can be long), removed after the test.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ch")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestTranscriptsLoad(t *testing.T) {
	main, err := loadTranscript(mainTranscript)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := loadTranscript(snapTranscript)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(segments(main)); n != 2 {
		t.Errorf("%s: %d segments, want 2", mainTranscript, n)
	}
	if n := len(segments(snap)); n != 4 {
		t.Errorf("%s: %d segments, want 4", snapTranscript, n)
	}
	for _, es := range [][]entry{main, snap} {
		for _, e := range es {
			if !strings.HasPrefix(e.Path, apiBase) || e.Status == 0 {
				t.Errorf("odd entry %+v", e)
			}
		}
	}
	if _, err := os.Stat(filepath.Join("testdata", "snapshot-config.json")); err != nil {
		t.Error(err)
	}
}

func TestBodyMatches(t *testing.T) {
	dec := func(s string) any {
		var v any
		if err := decodeJSON([]byte(s), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		rec, got string
		want     bool
	}{
		{`{"a":1}`, `{"a":1,"b":2}`, true},
		{`{"a":1}`, `{"a":2}`, false},
		{`{"a":false}`, `{}`, true},
		{`{"a":true}`, `{}`, false},
		{`{"p":"/x/y"}`, `{"p":"/other"}`, true},
		{`{"m":"Copy"}`, `{"m":"OnDemand"}`, false},
		{`{"d":[{"id":"root"}]}`, `{"d":[{"id":"root"},{"id":"x"}]}`, false},
		{`{"cpus":{"boot_vcpus":0}}`, `{"cpus":{"boot_vcpus":1,"max_vcpus":1}}`, false},
	}
	for _, c := range cases {
		if got := bodyMatches(dec(c.rec), dec(c.got)); got != c.want {
			t.Errorf("bodyMatches(%s, %s) = %v, want %v", c.rec, c.got, got, c.want)
		}
	}
}
