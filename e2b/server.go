// Package e2b serves den's VMs through E2B's wire protocol (its REST
// control plane and the envd Connect services of a sandbox), so that a
// program written with the official E2B SDKs runs against den unchanged.
package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// EnvdPort is the port of a sandbox's envd, in E2b-Sandbox-Port and in
// PORT-ID.DOMAIN host names.
const EnvdPort = 49983

// EnvdVersion is the envd version den's envd side answers as: the SDK
// turns features on by it (0.5.7: raw uploads, CloseStdin; below 0.6:
// no file metadata, no watch entries).
const EnvdVersion = "0.5.7"

// DefaultTemplate is the template that means the daemon's default image.
const DefaultTemplate = "base"

// Config is what the server needs of the daemon.
type Config struct {
	// Authenticate returns an API client that acts as the user whose
	// den token key is, and that user; an error when the key is not a
	// valid token.
	Authenticate func(ctx context.Context, key string) (*api.Client, string, error)
	// As returns an API client acting as user, for the timeouts the
	// server keeps.
	As func(user string) *api.Client
	// Domain is the domain of sandboxes' host names (PORT-ID.DOMAIN,
	// what sandbox.getHost gives), told to the SDK in each sandbox's
	// domain; "" tells none (the SDK's E2B_DOMAIN then).
	Domain string
	// Records is the file that keeps sandboxes' metadata and lifecycle.
	Records string
	Logger  *slog.Logger
}

// Server answers E2B's control plane and envd requests.
type Server struct {
	cfg     Config
	log     *slog.Logger
	recs    *store
	mux     *http.ServeMux
	envd    *http.ServeMux
	procs   *processes
	logs    *journal
	watches *watchers
	stopMu  sync.Mutex
	stop    context.CancelFunc
}

// New returns a server keeping its records in cfg.Records.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	recs, err := openStore(cfg.Records)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, recs: recs, mux: http.NewServeMux(), envd: http.NewServeMux(), procs: newProcesses(), logs: newJournal(), watches: newWatchers()}
	s.controlRoutes()
	s.envdRoutes()
	return s, nil
}

// Run keeps sandboxes' timeouts until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.expire(ctx)
		}
	}
}

// ServeHTTP routes a request to envd when it names a sandbox (the
// E2b-Sandbox-Id header, or a PORT-ID.DOMAIN host name), else to the
// control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("e2b: handler panic", "path", r.URL.Path, "panic", v)
			writeError(w, http.StatusInternalServerError, "den: internal error")
		}
	}()
	if id, port, ok := sandboxOf(r); ok {
		if port != EnvdPort {
			s.servePort(w, r, id, port)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), sandboxKey{}, id))
		s.envd.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

type sandboxKey struct{}

// sandboxOf is the sandbox and port a request is for, if it is an envd
// (or sandbox port) request.
func sandboxOf(r *http.Request) (string, int, bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port := EnvdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil {
				return id, 0, true
			}
			port = n
		}
		return id, port, true
	}
	host := r.Host
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return "", 0, false
	}
	p, id, ok := strings.Cut(label, "-")
	// A host name of digits and dashes (10-0-0-5.sslip.io) names an
	// address, not a sandbox.
	if !ok || validate.VMName(id) != nil || strings.Trim(id, "0123456789-") == "" {
		return "", 0, false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, false
	}
	return id, port, true
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeAPIError answers with err's status: den's API errors keep
// theirs, anything else is a 500.
func writeAPIError(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), "den: "+err.Error())
}

func statusOf(err error) int {
	var ae *api.Error
	switch {
	case errors.As(err, &ae) && ae.Status != 0:
		return ae.Status
	case errors.Is(err, api.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, api.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, api.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, api.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, api.ErrConflict), errors.Is(err, api.ErrBusy):
		return http.StatusConflict
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// caller is an authenticated request's API client and user.
type caller struct {
	api  *api.Client
	user string
	key  string
}

// authenticate establishes the caller from X-API-KEY (the control
// plane), X-Access-Token (envd: the create answer's envdAccessToken,
// which is the same den token) or a bearer token; it answers 401 itself
// when there is none or it is not valid.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (*caller, bool) {
	key := r.Header.Get("X-API-KEY")
	if key == "" {
		key = r.Header.Get("X-Access-Token")
	}
	if key == "" {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	if key == "" {
		writeError(w, http.StatusUnauthorized, "den: no API key: set E2B_API_KEY to a den token (den tokens add NAME)")
		return nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	cl, user, err := s.cfg.Authenticate(ctx, key)
	if err != nil {
		writeError(w, http.StatusUnauthorized, "den: the API key is not a valid den token (den tokens add NAME makes one)")
		return nil, false
	}
	return &caller{api: cl, user: user, key: key}, true
}

// authed wraps a handler that needs a caller; the caller's idle
// connections are closed when it returns.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		defer c.api.CloseIdle()
		h(w, r, c)
	}
}
