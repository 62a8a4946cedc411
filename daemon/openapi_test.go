package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	oaerrors "github.com/pb33f/libopenapi-validator/errors"
	"go.yaml.in/yaml/v3"

	"github.com/denhq/den/api"
	"github.com/denhq/den/users"
)

// documented is the operations api/openapi.yaml describes, as
// http.ServeMux patterns ("GET /v1/vms/{name}").
func documented(t *testing.T) []string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal([]byte(api.OpenAPI), &doc); err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	var ops []string
	for path, item := range doc.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				ops = append(ops, strings.ToUpper(method)+" "+path)
			}
		}
	}
	slices.Sort(ops)
	return ops
}

// TestOpenAPIRoutes: api/openapi.yaml describes every route the server
// serves and no other: each operation it describes reaches, through the
// server's own mux, the route of the same method and path pattern, and
// each route of the table the mux is built from is described.
func TestOpenAPIRoutes(t *testing.T) {
	s := NewServer(&fakeLifecycle{}, users.Keys{}, api.DaemonInfo{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ops := documented(t)
	for _, op := range ops {
		method, path, _ := strings.Cut(op, " ")
		r := httptest.NewRequest(method, strings.NewReplacer("{name}", "box", "{id}", "cp-1").Replace(path), nil)
		if _, pattern := s.mux.Handler(r); pattern != op {
			t.Errorf("openapi.yaml describes %s, which the server does not serve (its mux answers it with %q)", op, pattern)
		}
	}
	for _, rt := range routes {
		if !slices.Contains(ops, rt.pattern) {
			t.Errorf("the server serves %s, which openapi.yaml does not describe", rt.pattern)
		}
	}
}

// TestOpenAPIServed: GET /v1/openapi.yaml answers the document to a
// caller, and like every route refuses a request that proves none.
func TestOpenAPIServed(t *testing.T) {
	s := NewServer(&fakeLifecycle{}, users.Keys{}, api.DaemonInfo{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := checkOpenAPI(t, s)
	r := httptest.NewRequest("GET", "/v1/openapi.yaml", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r.WithContext(withCaller(r.Context(), Caller{User: "alice"})))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/yaml" || w.Body.String() != api.OpenAPI {
		t.Fatalf("GET /v1/openapi.yaml: %d %s, %d bytes", w.Code, w.Header().Get("Content-Type"), w.Body.Len())
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var eb api.ErrorBody
	if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || w.Code != http.StatusUnauthorized || eb.Code != "unauthenticated" {
		t.Fatalf("GET /v1/openapi.yaml without a caller: %d %s", w.Code, w.Body)
	}
}

// The validator of api/openapi.yaml, made once and used by one check at
// a time.
var (
	oaOnce sync.Once
	oaMu   sync.Mutex
	oaV    validator.Validator
	oaErr  error
)

func openAPIValidator(t *testing.T) validator.Validator {
	t.Helper()
	oaOnce.Do(func() {
		doc, err := libopenapi.NewDocument([]byte(api.OpenAPI))
		if err != nil {
			oaErr = err
			return
		}
		v, errs := validator.NewValidator(doc)
		if len(errs) > 0 {
			oaErr = fmt.Errorf("%v", errs)
			return
		}
		oaV = v
	})
	if oaErr != nil {
		t.Fatalf("openapi.yaml: %v", oaErr)
	}
	return oaV
}

// openAPIChecker serves h and checks every exchange against
// api/openapi.yaml: the request's route is described; a request the
// document refuses is refused (4xx or 5xx), never served; the answer's
// status is one the operation lists, its content type one the status
// lists, and its body (each line of a stream) valid against that schema;
// a stream ends with exactly one final line. The test fails at its end
// with every mismatch.
type openAPIChecker struct {
	t *testing.T
	h http.Handler
	v validator.Validator

	wg      sync.WaitGroup // exchanges being served
	mu      sync.Mutex
	checked int
	errs    []string
}

// checkOpenAPI returns h checked against api/openapi.yaml (see
// openAPIChecker).
func checkOpenAPI(t *testing.T, h http.Handler) http.Handler {
	c := &openAPIChecker{t: t, h: h, v: openAPIValidator(t)}
	t.Cleanup(c.report)
	return c
}

func (c *openAPIChecker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.wg.Add(1)
	defer c.wg.Done()
	// What the handler reads of the body, it reads as it would have.
	var reqBody bytes.Buffer
	if r.Body != nil {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(r.Body, &reqBody), r.Body}
	}
	rec := &exchangeRecorder{ResponseWriter: w}
	c.h.ServeHTTP(rec, r)
	c.check(r, reqBody.Bytes(), rec)
}

// report fails the test with the mismatches, once the exchanges in
// flight are done (or 10 s went by).
func (c *openAPIChecker) report() {
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.t.Log("openapi check: exchanges still being served at the end of the test are not checked")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.errs {
		if i == 20 {
			c.t.Errorf("openapi check: and %d more", len(c.errs)-i)
			break
		}
		c.t.Errorf("openapi check: %s", e)
	}
	c.t.Logf("openapi check: %d exchanges checked against api/openapi.yaml", c.checked)
}

func (c *openAPIChecker) fail(r *http.Request, status int, format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf("%s %s -> %d: %s", r.Method, r.URL.RequestURI(), status, fmt.Sprintf(format, a...)))
}

// check checks one exchange; see openAPIChecker.
func (c *openAPIChecker) check(r *http.Request, reqBody []byte, rec *exchangeRecorder) {
	req := r.Clone(context.Background())
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	resp, err := rec.response(req)
	if err != nil {
		c.fail(r, 0, "%v", err)
		return
	}
	oaMu.Lock()
	defer oaMu.Unlock()
	c.mu.Lock()
	c.checked++
	c.mu.Unlock()

	reqOK, reqErrs := c.v.ValidateHttpRequestSync(req)
	if !reqOK && slices.ContainsFunc(reqErrs, func(e *oaerrors.ValidationError) bool { return e.IsPathMissingError() || e.IsOperationMissingError() }) {
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			c.fail(r, resp.StatusCode, "served, but openapi.yaml describes no such operation")
		}
		return // the mux's own 404 or 405: no route
	}
	if !reqOK && resp.StatusCode < 400 {
		c.fail(r, resp.StatusCode, "served a request openapi.yaml refuses: %v", reqErrs)
	}
	if resp.Header.Get("Content-Type") != "application/x-ndjson" {
		if ok, errs := c.v.ValidateHttpResponse(req, resp); !ok {
			c.fail(r, resp.StatusCode, "the answer is not as openapi.yaml describes it: %v", errs)
		}
		return
	}
	// A stream: each line is a body of the status's schema, and the last
	// one, only, is final.
	lines := bytes.Split(bytes.TrimSuffix(rec.body.Bytes(), []byte("\n")), []byte("\n"))
	for i, line := range lines {
		one := *resp
		one.Body = io.NopCloser(bytes.NewReader(line))
		if ok, errs := c.v.ValidateHttpResponse(req, &one); !ok {
			c.fail(r, resp.StatusCode, "stream line %d %s is not as openapi.yaml describes it: %v", i+1, line, errs)
		}
		var ev struct{ Done bool }
		_ = json.Unmarshal(line, &ev)
		if ev.Done != (i == len(lines)-1) {
			c.fail(r, resp.StatusCode, "stream line %d of %d is done=%v: only the last line is final", i+1, len(lines), ev.Done)
		}
	}
}

// exchangeRecorder passes an answer through and keeps a copy: its
// status, header and body, or, for a connection taken over (the SSH
// upgrade), the answer the handler wrote on it.
type exchangeRecorder struct {
	http.ResponseWriter
	status int
	header http.Header
	body   bytes.Buffer
	conn   *headConn // the connection taken over (nil: none)
}

func (e *exchangeRecorder) WriteHeader(code int) {
	if e.status == 0 {
		e.status, e.header = code, e.ResponseWriter.Header().Clone()
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *exchangeRecorder) Write(p []byte) (int, error) {
	if e.status == 0 {
		e.WriteHeader(http.StatusOK)
	}
	e.body.Write(p)
	return e.ResponseWriter.Write(p)
}

func (e *exchangeRecorder) Flush() {
	if fl, ok := e.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

func (e *exchangeRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := e.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("hijack: %w", http.ErrNotSupported)
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	e.conn = &headConn{Conn: conn}
	return e.conn, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(e.conn)), nil
}

// response is the answer as a client read it.
func (e *exchangeRecorder) response(req *http.Request) (*http.Response, error) {
	if e.conn != nil {
		e.conn.mu.Lock()
		head := e.conn.head.Bytes()
		e.conn.mu.Unlock()
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), req)
		if err != nil {
			return nil, fmt.Errorf("the answer written on the connection taken over: %w", err)
		}
		resp.Body = http.NoBody
		return resp, nil
	}
	status, header := e.status, e.header
	if status == 0 { // nothing written
		status, header = http.StatusOK, e.ResponseWriter.Header().Clone()
	}
	return &http.Response{StatusCode: status, Header: header, Body: io.NopCloser(bytes.NewReader(e.body.Bytes())), Request: req}, nil
}

// headConn keeps what is written on a connection up to the end of the
// first HTTP header (the answer to an upgrade).
type headConn struct {
	net.Conn
	mu   sync.Mutex
	head bytes.Buffer
}

func (c *headConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !bytes.Contains(c.head.Bytes(), []byte("\r\n\r\n")) && c.head.Len() < 64<<10 {
		c.head.Write(p)
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}
