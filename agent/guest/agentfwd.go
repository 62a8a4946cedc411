//go:build linux

package guest

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	gossh "golang.org/x/crypto/ssh"
)

// forwardAgent listens on a private unix socket and forwards each
// connection to the client's SSH agent over an auth-agent@openssh.com
// channel. It returns the socket path for SSH_AUTH_SOCK.
func (ss *session) forwardAgent(a account) (string, func(), error) {
	dir, err := os.MkdirTemp("", "den-agent-auth-")
	if err != nil {
		return "", nil, fmt.Errorf("agent forwarding: %w", err)
	}
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("agent forwarding: %w", err)
	}
	if a.UID != uint32(os.Getuid()) {
		os.Chown(dir, int(a.UID), int(a.GID))
		os.Chown(sock, int(a.UID), int(a.GID))
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go ss.proxyAgent(c)
		}
	}()
	return sock, func() {
		l.Close()
		os.RemoveAll(dir)
	}, nil
}

func (ss *session) proxyAgent(c net.Conn) {
	defer c.Close()
	ch, reqs, err := ss.conn.OpenChannel("auth-agent@openssh.com", nil)
	if err != nil {
		return
	}
	defer ch.Close()
	go gossh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(ch, c)
		ch.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		io.Copy(c, ch)
		c.(*net.UnixConn).CloseWrite()
	}()
	wg.Wait()
}
