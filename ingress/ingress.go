// Package ingress serves each VM's HTTP port at a URL of its own, waking the VM for the request and keeping it awake while a request or connection is open.
package ingress

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"
)

// DefaultWakeTimeout bounds Backend.Dial, the VM's wake included, when
// Handler.WakeTimeout is zero.
const DefaultWakeTimeout = 60 * time.Second

// ErrNotFound is wrapped by Backend.Lookup's error for a VM that does
// not exist.
var ErrNotFound = errors.New("not found")

// Target is what the daemon knows of a VM's URL.
type Target struct {
	VM     string
	Port   int    // the guest's port (1-65535)
	Public bool   // no token needed
	Token  string // the VM's URL token (compared in constant time); "" with Public
}

// Backend is the daemon's side.
type Backend interface {
	// Lookup returns the URL settings of a VM; an error wrapping
	// ErrNotFound when there is none.
	Lookup(ctx context.Context, vm string) (Target, error)
	// Dial opens a stream to port inside the VM, starting or waking it
	// first; release ends the stream's claim that keeps the VM awake.
	// Called once per proxied connection; the handler calls release
	// exactly once, when it closes conn. With an error, Dial holds no
	// claim and release is not called. An error that wraps
	// syscall.ECONNREFUSED or says "connection refused" means nothing
	// listens on port.
	Dial(ctx context.Context, vm string, port int) (conn net.Conn, release func(), err error)
}

// Handler serves VMs' URLs: Host "<vm>.<Domain>" or path /vm/<vm>/. Its
// fields must not change once it serves.
type Handler struct {
	Backend     Backend
	Domain      string        // with it, Host "<vm>.<Domain>" routes to vm; "" disables host routing
	WakeTimeout time.Duration // bound on Dial (wake included); default 60s
	Logger      *slog.Logger

	once    sync.Once
	proxy   *httputil.ReverseProxy
	streams streams
}

// ServeHTTP routes r to its VM, checks its token and proxies it to the
// VM's port.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(h.init)
	rt, ok := h.route(w, r)
	if !ok {
		return
	}
	rt.gen = h.generation(rt.vm)
	t, err := h.Backend.Lookup(r.Context(), rt.vm)
	if err != nil && !errors.Is(err, ErrNotFound) {
		h.logger().Warn("ingress lookup", "vm", rt.vm, "err", err)
		denAnswer(w, "den: cannot look up vm "+rt.vm+" now; try again", http.StatusServiceUnavailable)
		return
	}
	found := err == nil
	if !h.authorize(w, r, &rt, t, found) {
		return
	}
	if t.Port < 1 || t.Port > 65535 {
		denAnswer(w, "den: vm "+rt.vm+" has no valid URL port", http.StatusBadGateway)
		return
	}
	rt.port = t.Port
	h.serveProxy(w, r, &rt)
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

func (h *Handler) wakeTimeout() time.Duration {
	if h.WakeTimeout > 0 {
		return h.WakeTimeout
	}
	return DefaultWakeTimeout
}
