//go:build linux

package guest

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// forwardDialTimeout bounds a direct-tcpip dial in the guest.
const forwardDialTimeout = 10 * time.Second

// directTCPIP is the direct-tcpip channel data (RFC 4254 7.2).
type directTCPIP struct {
	DestAddr   string
	DestPort   uint32
	OriginAddr string
	OriginPort uint32
}

// handleDirectTCPIP dials the requested address from the guest and copies
// both ways, passing half-closes on; the TCP connection is closed when the
// channel closes.
func (s *Server) handleDirectTCPIP(srv *ssh.Server, _ *gossh.ServerConn, nc gossh.NewChannel, ctx ssh.Context) {
	var d directTCPIP
	if err := gossh.Unmarshal(nc.ExtraData(), &d); err != nil {
		nc.Reject(gossh.ConnectionFailed, "bad direct-tcpip data: "+err.Error())
		return
	}
	if srv.LocalPortForwardingCallback == nil || !srv.LocalPortForwardingCallback(ctx, d.DestAddr, d.DestPort) {
		nc.Reject(gossh.Prohibited, "port forwarding is disabled")
		return
	}
	dest := net.JoinHostPort(d.DestAddr, strconv.Itoa(int(d.DestPort)))
	dctx, cancel := context.WithTimeout(ctx, forwardDialTimeout)
	var dialer net.Dialer
	conn, err := dialer.DialContext(dctx, "tcp", dest)
	cancel()
	if err != nil {
		nc.Reject(gossh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		conn.Close()
		return
	}
	s.forwards.Add(1)
	defer s.forwards.Add(-1)
	closed := make(chan struct{})
	go func() {
		gossh.DiscardRequests(reqs) // returns when the channel closes
		close(closed)
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(ch, conn)
		ch.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		io.Copy(conn, ch)
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-closed:
	}
	conn.Close()
	ch.Close()
	<-done
}
