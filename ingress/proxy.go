package ingress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type routeKey struct{}

// init builds the reverse proxy: one connection to the guest, and one
// claim on the VM, per proxied request.
func (h *Handler) init() {
	h.proxy = &httputil.ReverseProxy{
		Rewrite: h.rewrite,
		Transport: &http.Transport{
			DialContext:       h.dial,
			DisableKeepAlives: true, // each connection is a claim: none may idle
		},
		FlushInterval:  -1,
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.proxyError,
		ErrorLog:       slog.NewLogLogger(h.logger().Handler(), slog.LevelDebug),
	}
}

// serveProxy proxies r to the port rt names and logs it.
func (h *Handler) serveProxy(w http.ResponseWriter, r *http.Request, rt *route) {
	start := time.Now()
	rec := &statusWriter{ResponseWriter: w}
	st := &proxyState{route: *rt}
	h.proxy.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), routeKey{}, st)))
	status := rec.status
	if status == 0 {
		status = st.status // a protocol switch is written on the hijacked connection
	}
	h.logger().Debug("ingress", "vm", rt.vm, "method", r.Method, "path", r.URL.Path,
		"status", status, "duration", time.Since(start).Round(time.Millisecond))
}

// proxyState is a proxied request's route, and the status of the
// guest's answer.
type proxyState struct {
	route
	status int
}

// rewrite sends the request to the guest's port: the URL's host is
// "<vm>:<port>", which is what dial gets. The Host header stays the
// client's; den's prefix, token and cookie are taken out, and so is a
// Referer from another VM's URL.
func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	st := pr.In.Context().Value(routeKey{}).(*proxyState)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = net.JoinHostPort(st.vm, strconv.Itoa(st.port))
	out.Host = pr.In.Host
	if st.strip != "" {
		out.URL.Path = strings.TrimPrefix(out.URL.Path, st.strip)
		if raw, ok := strings.CutPrefix(out.URL.RawPath, st.strip); ok {
			out.URL.RawPath = raw
		} else {
			out.URL.RawPath = ""
		}
		out.Header.Set("X-Forwarded-Prefix", st.strip)
	}
	out.URL.RawQuery = stripQuery(out.URL.RawQuery)
	out.URL.ForceQuery = false
	if st.dropAuth {
		out.Header.Del("Authorization")
	}
	stripCookie(out.Header)
	if ref := pr.In.Header.Get("Referer"); ref != "" {
		if ref, ok := h.referer(ref, pr.In.Host, &st.route); ok {
			out.Header.Set("Referer", ref)
		} else {
			out.Header.Del("Referer")
		}
	}
	pr.SetXForwarded()
}

// modifyResponse keeps the guest's status for the log and drops the
// cookies it may not set (keepSetCookie).
func (h *Handler) modifyResponse(resp *http.Response) error {
	st, ok := resp.Request.Context().Value(routeKey{}).(*proxyState)
	if !ok {
		return nil
	}
	st.status = resp.StatusCode
	if dropped := keepSetCookie(resp.Header, resp.Request.Host, st.route); len(dropped) > 0 {
		h.logger().Debug("ingress: cookies refused", "vm", st.vm, "cookies", dropped)
	}
	return nil
}

// dialError is a failure of Backend.Dial.
type dialError struct {
	vm       string
	port     int
	timeout  time.Duration
	timedOut bool // WakeTimeout passed first
	err      error
}

func (e *dialError) Error() string {
	return fmt.Sprintf("dial port %d in vm %s: %v", e.port, e.vm, e.err)
}

func (e *dialError) Unwrap() error { return e.err }

// dial is the Transport's: addr is "<vm>:<port>" (rewrite). It bounds
// Backend.Dial by WakeTimeout, even a Dial that does not heed its
// context, and returns a conn that releases its claim when closed.
func (h *Handler) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	vm, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("ingress dial %s: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, fmt.Errorf("ingress dial %s: %w", addr, err)
	}
	timeout := h.wakeTimeout()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		conn    net.Conn
		release func()
		err     error
	}
	done := make(chan result, 1)
	go func() {
		conn, release, err := h.Backend.Dial(ctx, vm, port)
		done <- result{conn, release, err}
	}()
	select {
	case r := <-done:
		if r.err == nil && r.conn == nil {
			r.err = errors.New("no connection")
		}
		if r.err != nil {
			timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
			return nil, &dialError{vm: vm, port: port, timeout: timeout, timedOut: timedOut, err: r.err}
		}
		st, _ := ctx.Value(routeKey{}).(*proxyState)
		c, ok := h.track(vm, st, r.conn, r.release)
		if !ok {
			return nil, &dialError{vm: vm, port: port, timeout: timeout, err: errCut}
		}
		return c, nil
	case <-ctx.Done():
		go func() { // a Dial that came too late: give its claim back
			if r := <-done; r.err == nil && r.conn != nil {
				_ = newClaimConn(r.conn, r.release).Close()
			}
		}()
		timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
		return nil, &dialError{vm: vm, port: port, timeout: timeout, timedOut: timedOut, err: ctx.Err()}
	}
}

// proxyError answers a request the guest did not: 504 when the VM did
// not wake in time, 502 when nothing listens on the port or the
// connection failed.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	st, _ := r.Context().Value(routeKey{}).(*proxyState)
	vm, port := "?", 0
	if st != nil {
		vm, port = st.vm, st.port
	}
	if r.Context().Err() != nil {
		h.logger().Debug("ingress: client went away", "vm", vm, "err", err)
		w.WriteHeader(http.StatusBadGateway) // no one reads it
		return
	}
	var de *dialError
	switch {
	case errors.As(err, &de) && de.timedOut:
		denAnswer(w, fmt.Sprintf("den: vm %s did not answer within %s", vm, seconds(de.timeout)), http.StatusGatewayTimeout)
	case isRefused(err):
		denAnswer(w, fmt.Sprintf("den: nothing listens on port %d in vm %s", port, vm), http.StatusBadGateway)
	case de != nil:
		h.logger().Info("ingress dial", "vm", vm, "port", port, "err", err)
		denAnswer(w, "den: "+oneLine(err.Error()), http.StatusBadGateway)
	default:
		h.logger().Debug("ingress proxy", "vm", vm, "port", port, "err", err)
		denAnswer(w, fmt.Sprintf("den: port %d in vm %s: %s", port, vm, oneLine(err.Error())), http.StatusBadGateway)
	}
}

// isRefused says whether err is a refused connection: the guest's own
// (syscall) or as the guest's agent reports it over SSH (a message).
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused")
}

// seconds prints 60s rather than 1m0s.
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
