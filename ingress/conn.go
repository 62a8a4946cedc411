package ingress

import (
	"errors"
	"net"
	"net/http"
	"sync"
)

// claimConn is a connection to a guest's port that ends its claim on
// the VM, once, when it is closed.
type claimConn struct {
	net.Conn
	once    sync.Once
	release func()
	err     error
}

func newClaimConn(c net.Conn, release func()) *claimConn {
	return &claimConn{Conn: c, release: release}
}

// errCut: the VM's URL changed (Cut) after the request was let in.
var errCut = errors.New("the url's token changed; open it again")

// streams are the connections open to each VM's ports, and each VM's
// generation: Cut closes the connections and starts a new generation,
// so that a request let in before it cannot open one after it.
type streams struct {
	mu   sync.Mutex
	open map[string]map[*claimConn]struct{}
	gen  map[string]uint64
}

// generation is vm's generation now.
func (h *Handler) generation(vm string) uint64 {
	h.streams.mu.Lock()
	defer h.streams.mu.Unlock()
	return h.streams.gen[vm]
}

// track makes c (with its claim release) a stream of vm, unless vm's
// generation moved on since st was let in: then it closes c and returns
// false.
func (h *Handler) track(vm string, st *proxyState, c net.Conn, release func()) (net.Conn, bool) {
	s := &h.streams
	cc := &claimConn{Conn: c}
	cc.release = func() {
		s.mu.Lock()
		delete(s.open[vm], cc)
		if len(s.open[vm]) == 0 {
			delete(s.open, vm)
		}
		s.mu.Unlock()
		if release != nil {
			release()
		}
	}
	s.mu.Lock()
	if st != nil && st.gen != s.gen[vm] {
		s.mu.Unlock()
		_ = cc.Close()
		return nil, false
	}
	if s.open == nil {
		s.open = map[string]map[*claimConn]struct{}{}
	}
	if s.open[vm] == nil {
		s.open[vm] = map[*claimConn]struct{}{}
	}
	s.open[vm][cc] = struct{}{}
	s.mu.Unlock()
	return cc, true
}

// Cut closes every connection open through vm's URL, and those that
// requests let in before it would open: the daemon calls it when the
// URL's token changes or the URL turns private. It returns how many it
// closed.
func (h *Handler) Cut(vm string) int {
	s := &h.streams
	s.mu.Lock()
	if s.gen == nil {
		s.gen = map[string]uint64{}
	}
	s.gen[vm]++
	var cut []*claimConn
	for c := range s.open[vm] {
		cut = append(cut, c)
	}
	s.mu.Unlock()
	for _, c := range cut {
		_ = c.Close()
	}
	return len(cut)
}

// Close closes the connection and releases its claim, the first time.
func (c *claimConn) Close() error {
	c.once.Do(func() {
		c.err = c.Conn.Close()
		if c.release != nil {
			c.release()
		}
	})
	return c.err
}

// statusWriter notes the status written; Unwrap lets ReverseProxy flush
// and hijack the writer beneath.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap is for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
