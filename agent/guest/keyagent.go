//go:build linux

package guest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/denhq/den/agent"
)

// keyAgent carries the guest's SSH agent socket for den's secrets to
// den: the keys never enter the guest.
type keyAgent struct {
	mu   sync.Mutex
	conn gossh.Conn // the newest connection that announced it serves the keys
	// changed is closed (and dropped) when conn changes.
	changed chan struct{}
	ln      net.Listener
	path    string
}

// announceWait is how long a client connection waits for den to
// announce itself (after a boot, a wake or a restore den connects anew).
const announceWait = 10 * time.Second

// current is the connection that serves the keys, waiting up to wait
// for one; nil if none came.
func (k *keyAgent) current(wait time.Duration) gossh.Conn {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		k.mu.Lock()
		c := k.conn
		if k.changed == nil {
			k.changed = make(chan struct{})
		}
		ch := k.changed
		k.mu.Unlock()
		if c != nil {
			return c
		}
		select {
		case <-ch:
		case <-deadline.C:
			return nil
		}
	}
}

// ServeKeyAgent listens on path (agent.KeyAgentSocket), open to every
// user of the guest, and carries each connection to den over the newest
// host connection that sent agent.ReqKeyAgent. Sessions get path as
// SSH_AUTH_SOCK from then on.
func (s *Server) ServeKeyAgent(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("ssh agent socket: %w", err)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("ssh agent socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return fmt.Errorf("ssh agent socket: %w", err)
	}
	s.keys.mu.Lock()
	s.keys.ln, s.keys.path = ln, path
	s.keys.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.keys.carry(c, s.log.Warn)
		}
	}()
	return nil
}

// socket is the socket's path while it is served.
func (k *keyAgent) socket() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ln == nil {
		return ""
	}
	return k.path
}

func (k *keyAgent) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ln != nil {
		k.ln.Close()
		k.ln = nil
	}
}

// announce makes conn the one connections are carried over.
func (k *keyAgent) announce(conn gossh.Conn) {
	k.mu.Lock()
	k.conn = conn
	if k.changed != nil {
		close(k.changed)
		k.changed = nil
	}
	k.mu.Unlock()
	go func() {
		conn.Wait()
		k.mu.Lock()
		if k.conn == conn {
			k.conn = nil
		}
		k.mu.Unlock()
	}()
}

// carry copies one client connection to a channel to den, both ways.
func (k *keyAgent) carry(c net.Conn, warn func(string, ...any)) {
	defer c.Close()
	conn := k.current(announceWait)
	if conn == nil {
		return // den has not connected: the client sees an agent that failed
	}
	ch, reqs, err := conn.OpenChannel(agent.ChanKeyAgent, nil)
	if err != nil {
		warn("ssh agent: den refused the channel", "err", err)
		return
	}
	defer ch.Close()
	go gossh.DiscardRequests(reqs)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(ch, c)
		_ = ch.CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(c, ch)
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	<-done
}

// ctlKeyAgent answers agent.ReqKeyAgent: this connection serves the keys.
func (s *Server) ctlKeyAgent(ctx ssh.Context, _ []byte) (any, error) {
	conn, ok := ctx.Value(ssh.ContextKeyConn).(gossh.Conn)
	if !ok {
		return nil, errors.New("no connection")
	}
	s.keys.announce(conn)
	return struct{}{}, nil
}
