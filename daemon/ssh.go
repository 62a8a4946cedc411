package daemon

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/api"
	"github.com/denhq/den/sshrelay"
)

// sshUpgrade turns the request's connection into an SSH connection whose
// channels are relayed to the VM's agent: how `den exec` and `den ssh`
// reach a VM. The connection proved its caller (identity.go), who must own
// the VM, so there is no SSH auth here.
func (s *Server) sshUpgrade(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if r.Header.Get("Upgrade") != api.UpgradeSSH {
		writeJSON(w, http.StatusBadRequest, api.ErrorBody{Error: "missing Upgrade: " + api.UpgradeSSH, Code: "invalid"})
		return
	}
	// Wake or start the VM first, so errors come back as HTTP answers. A
	// wake, once started, finishes even if the client goes away.
	octx, cancel := opContext(r)
	sess, err := s.sessions.Open(octx, name, owner(r))
	cancel()
	if err != nil {
		writeError(w, err)
		return
	}
	defer sess.Release()
	sess.Tag(whoOf(callerOf(r)), "den")
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, api.ErrorBody{Error: "connection cannot be upgraded", Code: "internal"})
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	if tok := callerOf(r).Token; tok != "" {
		release, ok := s.held.hold(tok, conn)
		if !ok {
			return // revoked meanwhile
		}
		defer release()
	}
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + api.UpgradeSSH + "\r\nConnection: Upgrade\r\n\r\n")
	if err := brw.Flush(); err != nil {
		return
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(s.hostKey)
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	sc, chans, reqs, err := ssh.NewServerConn(&readerConn{Conn: conn, r: brw.Reader}, cfg)
	if err != nil {
		s.log.Debug("den: ssh handshake on api socket", "vm", name, "err", err)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The agent connection dying (VM stopped) ends the client's too.
	go func() {
		select {
		case <-sess.Done:
			sc.Close()
		case <-ctx.Done():
		}
	}()
	sshrelay.Serve(ctx, chans, sess.Conn, sshrelay.Hooks{Logger: s.log})
}

// whoOf names a caller in a VM's activity record: the user, and the
// token or the connection it came through.
func whoOf(c Caller) string {
	who := c.User
	if who == "" {
		who = "admin"
	}
	if c.Token != "" {
		return who + " (token " + c.Token + ")"
	}
	if c.Source != "" {
		return who + " (" + c.Source + ")"
	}
	return who
}

// readerConn reads first what the HTTP server buffered.
type readerConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }
