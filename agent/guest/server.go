//go:build linux

package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/agent/guest/procrec"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// Config configures a Server.
type Config struct {
	// HostKey is the agent's SSH host key.
	HostKey gossh.Signer
	// HostKeyPath is the file HostKey was loaded from: a new identity
	// writes the agent's new host key there. Empty keeps a new key in
	// memory only.
	HostKeyPath string
	// AuthorizedKeys returns the client keys allowed in; it is called on
	// every authentication attempt. No keys: nobody gets in.
	AuthorizedKeys func() ([]gossh.PublicKey, error)
	// System is the guest's privileged operations; nil uses the real ones.
	System *System
	// Leases are the keep-awake leases reported in Activity; nil makes a
	// new set.
	Leases *Leases
	// Reaper, when the agent is init, reaps orphans; the server starts
	// its processes through it.
	Reaper *Reaper
	// ProcRecord, when set, is the guest's process record: sessions tag
	// their commands in it and ReqProcLog reads it. Nil: no record.
	ProcRecord *procrec.Recorder
	// ProcRecordOff says why there is no ProcRecord (ReqProcLog answers
	// it).
	ProcRecordOff string
	// Logger; nil uses slog.Default().
	Logger *slog.Logger
}

// Server is the agent's SSH server.
type Server struct {
	cfg    Config
	sys    *System
	log    *slog.Logger
	ssh    *ssh.Server
	leases *Leases
	freeze *freezeState

	keys keyAgent // den's SSH secrets' agent socket (keyagent.go)
	// secretEnv is what sessions get of den's HTTPS secrets (trust.go).
	secretEnv atomic.Pointer[[]string]
	procs     procCounter
	sessions  atomic.Int64
	forwards  atomic.Int64
	closing   atomic.Bool
}

// New returns a server; serve it with Serve, ServePort or HandleConn.
func New(cfg Config) (*Server, error) {
	if cfg.HostKey == nil {
		return nil, errors.New("agent server: no host key")
	}
	if cfg.AuthorizedKeys == nil {
		return nil, errors.New("agent server: no authorized keys source")
	}
	s := &Server{cfg: cfg, sys: cfg.System, log: cfg.Logger, leases: cfg.Leases}
	if s.sys == nil {
		s.sys = DefaultSystem()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.leases == nil {
		s.leases = NewLeases()
	}
	s.freeze = newFreezeState(s.sys.Freezer, s.log)
	s.ssh = &ssh.Server{
		HostSigners:          []ssh.Signer{cfg.HostKey},
		PublicKeyHandler:     s.authorize,
		ConnCallback:         s.connCallback,
		ServerConfigCallback: s.serverConfig,
		ConnectionFailedCallback: func(c net.Conn, err error) {
			s.log.Warn("ssh handshake failed", "remote", c.RemoteAddr(), "err", err)
		},
		LocalPortForwardingCallback: func(ssh.Context, string, uint32) bool { return true },
		ChannelHandlers: map[string]ssh.ChannelHandler{
			"session":      s.handleSession,
			"direct-tcpip": s.handleDirectTCPIP,
		},
		RequestHandlers:   s.requestHandlers(),
		SubsystemHandlers: map[string]ssh.SubsystemHandler{},
	}
	return s, nil
}

// Leases is the server's keep-awake lease set.
func (s *Server) Leases() *Leases { return s.leases }

// rotateHostKey makes a new ed25519 host key, writes it to the config's
// HostKeyPath (atomically) and serves it to new connections; connections
// already open keep the key they were made with.
func (s *Server) rotateHostKey() (gossh.Signer, error) {
	pemData, key, err := agent.NewEd25519Key("den-agent")
	if err != nil {
		return nil, fmt.Errorf("new host key: %w", err)
	}
	if p := s.cfg.HostKeyPath; p != "" {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, fmt.Errorf("new host key: %w", err)
		}
		// Synced with the rest of the new identity (syncRoot).
		if err := atomicfile.Replace(p, pemData, 0o600); err != nil {
			return nil, fmt.Errorf("new host key: %w", err)
		}
		if err := os.Remove(p + ".pub"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("new host key: stale public key", "err", err)
		}
	}
	// Replaces the key of the same algorithm; the SSH library reads the
	// list under its lock for every new connection.
	s.ssh.AddHostKey(key)
	return key, nil
}

// Serve accepts connections on l (vsock, or a unix socket in tests) until
// l or the server is closed.
func (s *Server) Serve(l net.Listener) error {
	err := s.ssh.Serve(l)
	if errors.Is(err, ssh.ErrServerClosed) || s.closing.Load() {
		return nil
	}
	return fmt.Errorf("agent serve %s: %w", l.Addr(), err)
}

// HandleConn serves one SSH connection and returns when it ends.
func (s *Server) HandleConn(c net.Conn) {
	if s.closing.Load() {
		c.Close()
		return
	}
	s.ssh.HandleConn(c)
}

// Close stops the listeners and ends every connection (which hangs up
// their sessions).
func (s *Server) Close() error {
	s.closing.Store(true)
	s.keys.close()
	s.freeze.thawAll("agent stopping")
	return s.ssh.Close()
}

// Sessions is the number of open sessions.
func (s *Server) Sessions() int { return int(s.sessions.Load()) }

func (s *Server) authorize(ctx ssh.Context, key ssh.PublicKey) bool {
	keys, err := s.cfg.AuthorizedKeys()
	if err != nil {
		s.log.Warn("reading authorized keys", "err", err)
	}
	wire := key.Marshal()
	for _, k := range keys {
		if bytes.Equal(k.Marshal(), wire) {
			return true
		}
	}
	s.log.Warn("refused key", "user", ctx.User(), "key", gossh.FingerprintSHA256(key), "known", len(keys))
	return false
}

type ctxKey string

const nonceKey ctxKey = "den-nonce"

// versionTimeout bounds the wait for a client's version line.
const versionTimeout = 15 * time.Second

// connCallback reads the client's version line before the SSH library
// does, to echo the den client's nonce in the server version.
func (s *Server) connCallback(ctx ssh.Context, c net.Conn) net.Conn {
	if s.closing.Load() {
		c.Close()
		return nil
	}
	c.SetReadDeadline(time.Now().Add(versionTimeout))
	pc, line, err := peekVersion(c)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		s.log.Warn("no ssh version from the host", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return nil
	}
	ctx.SetValue(nonceKey, agent.ClientNonce(line))
	s.log.Debug("host connection", "remote", c.RemoteAddr(), "client", line)
	return pc
}

func (s *Server) serverConfig(ctx ssh.Context) *gossh.ServerConfig {
	nonce, _ := ctx.Value(nonceKey).(string)
	return &gossh.ServerConfig{ServerVersion: agent.ServerVersion(nonce)}
}

// replayConn returns buffered bytes before reading from its conn.
type replayConn struct {
	net.Conn
	buf []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// peekVersion reads lines until the SSH version line (RFC 4253 allows
// lines before it) and returns a conn that replays them.
func peekVersion(c net.Conn) (net.Conn, string, error) {
	var all []byte
	lineStart := 0
	b := make([]byte, 1)
	for len(all) < 8192 {
		if _, err := c.Read(b); err != nil {
			return nil, "", fmt.Errorf("read version: %w", err)
		}
		all = append(all, b[0])
		if b[0] != '\n' {
			continue
		}
		line := string(all[lineStart:])
		if len(line) > 4 && line[:4] == "SSH-" {
			return &replayConn{Conn: c, buf: all}, line, nil
		}
		lineStart = len(all)
	}
	return nil, "", errors.New("read version: no version line in 8 KiB")
}

// hostname is the guest's hostname, or "".
func hostname() string {
	h, _ := os.Hostname()
	return h
}
