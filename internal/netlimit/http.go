package netlimit

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// HTTPLimits are one HTTP listener's limits. docs/api.md lists every
// listener's in one table ("Limits"); API and Ingress are den's.
type HTTPLimits struct {
	// MaxHeaderBytes bounds a request's header (request line included);
	// more is answered 431 and the connection closed.
	MaxHeaderBytes int
	// MaxHeaderFields bounds how many header fields a request has; more
	// are answered 431 (nothing passes them on).
	MaxHeaderFields int
	// HeaderTimeout: a request's header, and a TLS handshake, must
	// arrive within it.
	HeaderTimeout time.Duration
	// RequestTimeout, when > 0: the whole request, body included, must
	// arrive within it.
	RequestTimeout time.Duration
	// ReadTimeout, when > 0: a read of a request's body that gets
	// nothing for this long fails (a stalled upload is cut, one that
	// moves is not).
	ReadTimeout time.Duration
	// WriteTimeout, when > 0: a write of an answer that the client does
	// not take for this long fails (a stalled download is cut; a stream
	// that moves, or waits to write, is not).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection after this long without
	// a request.
	IdleTimeout time.Duration
	// MaxConns and MaxConnsPerSource cap a TCP listener's connections:
	// see Conns (a source is an IPv4 address or an IPv6 /64).
	MaxConns, MaxConnsPerSource int
	// LogBurst lines about failures before authentication (refused
	// connections, failed TLS handshakes) are logged at once, then one
	// per LogEvery; those held back are summed up in one line at most
	// once per LogSummary.
	LogBurst             int
	LogEvery, LogSummary time.Duration
}

// API is the limits of den's API, on its unix socket and its TLS
// listener (--api-listen). API requests are small: the whole request has
// RequestTimeout. Streams (progress, logs) and the SSH upgrade run as
// long as they need.
var API = HTTPLimits{
	MaxHeaderBytes: 64 << 10, MaxHeaderFields: 256,
	HeaderTimeout:  10 * time.Second,
	RequestTimeout: 30 * time.Second,
	WriteTimeout:   time.Minute,
	IdleTimeout:    2 * time.Minute,
	MaxConns:       256, MaxConnsPerSource: 32,
	LogBurst: 20, LogEvery: 5 * time.Second, LogSummary: time.Minute,
}

// Ingress is the limits of the VMs' URLs (--http-listen): bodies of any
// size, as long as they move.
var Ingress = HTTPLimits{
	MaxHeaderBytes: 64 << 10, MaxHeaderFields: 256,
	HeaderTimeout: 30 * time.Second,
	ReadTimeout:   time.Minute,
	WriteTimeout:  time.Minute,
	IdleTimeout:   2 * time.Minute,
	MaxConns:      1024, MaxConnsPerSource: 64,
	LogBurst: 20, LogEvery: 5 * time.Second, LogSummary: time.Minute,
}

// HTTP is an http.Server with limits. Its Server serves any listener;
// Listen wraps a TCP listener with the connection caps.
type HTTP struct {
	// Server serves the handler given to NewHTTP; set its ConnContext
	// and such before it serves, not its limits.
	Server *http.Server
	limits HTTPLimits
	name   string
	log    *slog.Logger
	conns  *Conns
	noisy  *LogLimiter
}

// NewHTTP serves h with limits l; name says which listener in log lines
// ("api listener").
func NewHTTP(name string, h http.Handler, l HTTPLimits, logger *slog.Logger) *HTTP {
	if logger == nil {
		logger = slog.Default()
	}
	s := &HTTP{limits: l, name: name, log: logger,
		conns: NewConns(l.MaxConns, l.MaxConnsPerSource),
		noisy: NewLogLimiter(logger, name, l.LogBurst, l.LogEvery, l.LogSummary)}
	s.Server = &http.Server{
		Handler:           s.handler(h),
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ReadHeaderTimeout: l.HeaderTimeout,
		ReadTimeout:       l.RequestTimeout,
		IdleTimeout:       l.IdleTimeout,
		ErrorLog:          log.New(errorLog{s}, "", 0),
	}
	return s
}

// Close logs what the rate limit held back. It does not close Server.
func (s *HTTP) Close() { s.noisy.Close() }

// Count is how many connections of the TCP listeners are open, in all
// and from src.
func (s *HTTP) Count(src string) (all, from int) { return s.conns.Count(src) }

// Listen wraps ln (TCP) with the connection caps: a connection over
// MaxConnsPerSource is closed at once (answered 503 first when plain,
// not TLS), and one over MaxConns evicts another (see Conns).
func (s *HTTP) Listen(ln net.Listener, plain bool) net.Listener {
	return &listener{Listener: ln, s: s, plain: plain}
}

type listener struct {
	net.Listener
	s     *HTTP
	plain bool
}

// refusal is the answer on a plain connection refused by its source's
// cap.
const refusal = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 44\r\n\r\nden: too many connections from this address\n"

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		e, victim, err := l.s.conns.Admit(c)
		if victim != nil {
			l.s.noisy.Log(slog.LevelWarn, "den: "+l.s.name+": too many connections, closing the oldest of the address with the most",
				"remote", victim.RemoteAddr().String(), "limit", l.s.limits.MaxConns)
			_ = victim.Close()
		}
		if err != nil {
			l.s.noisy.Log(slog.LevelWarn, "den: "+l.s.name+": refusing a connection",
				"remote", c.RemoteAddr().String(), "err", err, "limit", l.s.limits.MaxConnsPerSource)
			if l.plain {
				go func() {
					_ = c.SetWriteDeadline(time.Now().Add(time.Second))
					_, _ = io.WriteString(c, refusal)
					_ = c.Close()
				}()
			} else {
				_ = c.Close()
			}
			continue
		}
		return &countedConn{Conn: c, e: e, conns: l.s.conns}, nil
	}
}

// countedConn stops being counted when it is closed.
type countedConn struct {
	net.Conn
	e     *Conn
	conns *Conns
}

func (c *countedConn) Close() error {
	c.conns.Release(c.e)
	return c.Conn.Close()
}

// errorLog takes net/http's log lines: failed TLS handshakes through the
// rate limit, the rest as warnings.
type errorLog struct{ s *HTTP }

func (e errorLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if len(line) > 300 {
		line = line[:300] + "..."
	}
	if strings.Contains(line, "TLS handshake error") {
		e.s.noisy.Log(slog.LevelInfo, "den: "+e.s.name+": tls handshake failed", "err", line)
	} else {
		e.s.log.Warn("den: "+e.s.name, "err", line)
	}
	return len(p), nil
}

// handler applies ReadTimeout and WriteTimeout to h's requests: each
// read of the body, and each write or flush of the answer, has its own
// deadline, set as it starts.
func (s *HTTP) handler(h http.Handler) http.Handler {
	l := s.limits
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := headerFields(r); l.MaxHeaderFields > 0 && n > l.MaxHeaderFields {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("den: too many header fields (%d; the limit is %d)", n, l.MaxHeaderFields),
				http.StatusRequestHeaderFieldsTooLarge)
			return
		}
		rc := http.NewResponseController(w)
		sw := &stallWriter{ResponseWriter: w, rc: rc, d: l.WriteTimeout}
		if l.ReadTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
			b := &stallBody{ReadCloser: r.Body, rc: rc, d: l.ReadTimeout, clear: r.ProtoMajor >= 2}
			r.Body = b
			// net/http reads what the handler left of the body (to
			// reuse the connection): with this deadline, not forever.
			defer func() {
				if r.ProtoMajor < 2 && !sw.isHijacked() {
					_ = rc.SetReadDeadline(time.Now().Add(l.ReadTimeout))
				}
			}()
		}
		sw.disarm() // until the first write
		defer sw.finish(l.ReadTimeout)
		h.ServeHTTP(sw, r)
	})
}

// headerFields is how many header fields r came with (Host included).
func headerFields(r *http.Request) int {
	n := 1
	for _, v := range r.Header {
		n += len(v)
	}
	return n
}

// stallBody is a request body whose every read has ReadTimeout. The
// deadline is left alone once the body ended: net/http watches the
// connection then, without one. Over HTTP/2 a deadline is a timer that
// fails the body when it fires, so it is cleared after each read.
type stallBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	d     time.Duration
	clear bool
	mu    sync.Mutex
	done  bool
}

func (b *stallBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	if done {
		return b.ReadCloser.Read(p)
	}
	_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.mu.Lock()
		b.done = true
		b.mu.Unlock()
	} else if b.clear {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// stallWriter is an answer whose every write and flush has WriteTimeout
// (none when 0), cleared once it is done: a handler may wait as long as
// it needs between writes. It notes a hijack: the connection's
// deadlines are the new owner's then.
type stallWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	d        time.Duration
	mu       sync.Mutex
	hijacked bool
}

// arm and disarm set the write deadline, when there is one (a
// connection once hijacked is not theirs to touch).
func (w *stallWriter) arm() {
	if w.d > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	}
}

func (w *stallWriter) disarm() {
	if w.d > 0 {
		_ = w.rc.SetWriteDeadline(time.Time{})
	}
}

func (w *stallWriter) Write(p []byte) (int, error) {
	w.arm()
	defer w.disarm()
	return w.ResponseWriter.Write(p)
}

// FlushError is for http.ResponseController.
func (w *stallWriter) FlushError() error {
	w.arm()
	defer w.disarm()
	return w.rc.Flush()
}

func (w *stallWriter) Flush() { _ = w.FlushError() }

// Hijack hands the connection over, without deadlines (net/http clears
// them).
func (w *stallWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err == nil {
		w.mu.Lock()
		w.hijacked = true
		w.mu.Unlock()
	}
	return c, brw, err
}

// Unwrap is for http.ResponseController.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *stallWriter) isHijacked() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hijacked
}

// finish arms the deadline for what net/http writes after the handler
// returns (the buffered rest of the answer), after it may first have
// read what the handler left of the body, for up to read.
func (w *stallWriter) finish(read time.Duration) {
	if w.d > 0 && !w.isHijacked() {
		_ = w.rc.SetWriteDeadline(time.Now().Add(read + w.d))
	}
}
