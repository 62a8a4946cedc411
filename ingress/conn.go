package ingress

import (
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
