package sshgw

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/sshproxy"
)

// DenUser is the SSH user name that runs den verbs instead of reaching a
// VM (so a VM named "den" cannot be reached through the gateway).
const DenUser = "den"

// Errors a Backend wraps.
var (
	// ErrNoVM: the user has no VM of that name (it does not exist, or is
	// another user's: the gateway says the same in both cases).
	ErrNoVM = errors.New("no such vm")
	// ErrUnknownKey: no user has registered the key.
	ErrUnknownKey = errors.New("unknown key")
)

// Upstream is a claim on a running VM's guest agent connection.
type Upstream struct {
	// Conn opens channels on the agent.
	Conn sshproxy.Opener
	// Done is closed when the agent connection breaks (the VM stopped).
	Done <-chan struct{}
	// Release ends the claim; called once, when the client's connection
	// ends.
	Release func()
}

// Backend is what the gateway needs of den: who owns a key, and a VM's
// agent connection.
type Backend interface {
	// UserForKey returns the user whose key has this SHA256 fingerprint;
	// an error wrapping ErrUnknownKey if nobody registered it.
	UserForKey(ctx context.Context, fingerprint string) (string, error)
	// Open starts or wakes user's VM and claims its agent connection;
	// an error wrapping ErrNoVM if user has no VM of that name.
	Open(ctx context.Context, vm, user string) (*Upstream, error)
}

// Config configures a Server.
type Config struct {
	// HostKey is the gateway's host key (persistent: clients pin it).
	HostKey gossh.Signer
	Backend Backend
	// Den runs den verbs for `ssh den@host VERB`; nil refuses them.
	Den *DenCommand
	// HandshakeTimeout bounds the time from TCP accept to a successful
	// authentication (default 30s).
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection on which nothing was sent or
	// received for this long (default 1h; a client's ServerAliveInterval
	// keeps it open).
	IdleTimeout time.Duration
	// MaxUnauthenticated caps connections that have not authenticated
	// yet; more are closed at once (default DefaultMaxUnauthenticated).
	MaxUnauthenticated int
	// MaxUnauthenticatedPerSource caps those of one source address
	// (default DefaultMaxUnauthenticatedPerSource).
	MaxUnauthenticatedPerSource int
	// MaxChannels caps the channels open at once on one connection
	// (default DefaultMaxChannels).
	MaxChannels int
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
}

// The gateway's limits (defaults of Config, and MaxUserName), listed in
// docs/api.md under "Limits".
const (
	// DefaultHandshakeTimeout bounds the time from TCP accept to a
	// successful authentication; the connection is closed then.
	DefaultHandshakeTimeout = 30 * time.Second
	// DefaultIdleTimeout closes a connection on which nothing was sent
	// or received for this long.
	DefaultIdleTimeout = time.Hour
	// DefaultMaxUnauthenticated connections may be authenticating at
	// once; more are closed at once, before the SSH version line.
	DefaultMaxUnauthenticated = 32
	// DefaultMaxUnauthenticatedPerSource of those may come from one
	// source IP address, so that one address cannot take every slot.
	DefaultMaxUnauthenticatedPerSource = 8
	// DefaultMaxChannels channels (sessions and forwards) may be open at
	// once on one connection; more are rejected with ResourceShortage
	// and a message ("administratively prohibited" is not used: the
	// client may retry when one closes). It is also the most sessions
	// one OpenSSH ControlMaster connection can run at once.
	DefaultMaxChannels = 64
	// MaxUserName is the longest SSH user name (a VM name, or "den")
	// accepted, in bytes: a longer one fails authentication, with a
	// banner that says why, and is logged cut short.
	MaxUserName = 256
)

// Server is a running SSH gateway.
type Server struct {
	cfg    Config
	log    *slog.Logger
	srv    *gliderssh.Server
	ln     net.Listener
	unauth chan struct{} // one token per unauthenticated connection

	mu       sync.Mutex
	bySource map[string]int // unauthenticated connections per source IP
	done     chan struct{}
	closed   atomic.Bool
}

// Permission extensions set at authentication.
const (
	extUser = "den-user"
	extKey  = "den-key"
)

// Listen starts a gateway on addr (host:port; port 0 picks one, see
// Addr) and serves it until Close.
func Listen(addr string, cfg Config) (*Server, error) {
	if cfg.HostKey == nil || cfg.Backend == nil {
		return nil, errors.New("ssh gateway: host key and backend are required")
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxUnauthenticated <= 0 {
		cfg.MaxUnauthenticated = DefaultMaxUnauthenticated
	}
	if cfg.MaxUnauthenticatedPerSource <= 0 {
		cfg.MaxUnauthenticatedPerSource = DefaultMaxUnauthenticatedPerSource
	}
	if cfg.MaxChannels <= 0 {
		cfg.MaxChannels = DefaultMaxChannels
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ssh gateway: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ln: ln, unauth: make(chan struct{}, cfg.MaxUnauthenticated),
		bySource: map[string]int{}, done: make(chan struct{})}
	s.srv = &gliderssh.Server{
		Version:              "den",
		HostSigners:          []gliderssh.Signer{cfg.HostKey},
		IdleTimeout:          cfg.IdleTimeout,
		ConnCallback:         s.accept,
		PublicKeyHandler:     s.knownKey,
		ServerConfigCallback: s.serverConfig,
		ChannelHandlers: map[string]gliderssh.ChannelHandler{
			"session":      s.channel,
			"direct-tcpip": s.channel,
			"default":      rejectChannel,
		},
		ConnectionFailedCallback: func(c net.Conn, err error) {
			s.log.Debug("den: gateway handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		},
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, gliderssh.ErrServerClosed) && !s.closed.Load() {
			s.log.Error("den: ssh gateway stopped", "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the gateway listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Fingerprint is the SHA256 fingerprint of the gateway's host key.
func (s *Server) Fingerprint() string { return gossh.FingerprintSHA256(s.cfg.HostKey.PublicKey()) }

// Close stops listening and closes every connection (their VM claims are
// released).
func (s *Server) Close() error {
	s.closed.Store(true)
	err := s.srv.Close()
	_ = s.ln.Close() // in case Serve had not tracked it yet
	<-s.done
	return err
}

type stateKey struct{}

// accept admits a new TCP connection while fewer than MaxUnauthenticated
// (and MaxUnauthenticatedPerSource of its address) are still
// authenticating, and arms its handshake timeout.
func (s *Server) accept(ctx gliderssh.Context, c net.Conn) net.Conn {
	src := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(src); err == nil {
		src = host
	}
	s.mu.Lock()
	if s.bySource[src] >= s.cfg.MaxUnauthenticatedPerSource {
		s.mu.Unlock()
		s.log.Warn("den: ssh gateway: too many unauthenticated connections from one address, refusing one", "remote", c.RemoteAddr().String(), "limit", s.cfg.MaxUnauthenticatedPerSource)
		return nil
	}
	select {
	case s.unauth <- struct{}{}:
	default:
		s.mu.Unlock()
		s.log.Warn("den: ssh gateway: too many unauthenticated connections, refusing one", "remote", c.RemoteAddr().String(), "limit", cap(s.unauth))
		return nil
	}
	s.bySource[src]++
	s.mu.Unlock()
	st := &connState{keys: map[string]string{}}
	st.releaseSlot = sync.OnceFunc(func() {
		s.mu.Lock()
		if s.bySource[src]--; s.bySource[src] <= 0 {
			delete(s.bySource, src)
		}
		s.mu.Unlock()
		<-s.unauth
	})
	st.timer = time.AfterFunc(s.cfg.HandshakeTimeout, func() {
		if !st.authed.Load() {
			s.log.Debug("den: gateway handshake timed out", "remote", c.RemoteAddr().String())
			c.Close()
		}
	})
	ctx.SetValue(stateKey{}, st)
	go func() {
		<-ctx.Done() // the connection ended
		st.timer.Stop()
		st.releaseSlot()
		st.close()
	}()
	return c
}

func state(ctx gliderssh.Context) *connState {
	st, _ := ctx.Value(stateKey{}).(*connState)
	return st
}

// knownKey admits a key that some user registered. Which user it logs in
// as is decided in verifiedKey, for the key the client proved it holds.
func (s *Server) knownKey(ctx gliderssh.Context, key gliderssh.PublicKey) bool {
	st := state(ctx)
	if len(ctx.User()) > MaxUserName {
		return false // said in the banner
	}
	return st != nil && st.lookup(ctx, s.cfg.Backend, key, s.log)
}

// banner is sent before the first authentication answer: empty, except
// for a user name over MaxUserName, which no key can log in as.
func (s *Server) banner(c gossh.ConnMetadata) string {
	if len(c.User()) <= MaxUserName {
		return ""
	}
	s.log.Warn("den: ssh gateway: user name too long, refusing", "remote", c.RemoteAddr().String(), "user", validate.Quote(c.User()), "limit", MaxUserName)
	return fmt.Sprintf("den: the user name is too long (%d bytes; the limit is %d): it names a VM, or is %q\r\n", len(c.User()), MaxUserName, DenUser)
}

// serverConfig adds to gliderlabs' per-connection config what it does not
// offer: the user of the verified key, and the end of the handshake.
func (s *Server) serverConfig(ctx gliderssh.Context) *gossh.ServerConfig {
	st := state(ctx)
	return &gossh.ServerConfig{
		BannerCallback: s.banner,
		VerifiedPublicKeyCallback: func(_ gossh.ConnMetadata, key gossh.PublicKey, _ *gossh.Permissions, _ string) (*gossh.Permissions, error) {
			return st.verified(key)
		},
		AuthLogCallback: func(_ gossh.ConnMetadata, _ string, err error) {
			if err == nil {
				st.authed.Store(true)
				st.timer.Stop()
				st.releaseSlot()
			}
		},
	}
}

// lookup says whether some user registered key, and remembers whose it is.
func (st *connState) lookup(ctx context.Context, b Backend, key gossh.PublicKey, log *slog.Logger) bool {
	fp := gossh.FingerprintSHA256(key)
	user, err := b.UserForKey(ctx, fp)
	if err != nil {
		if !errors.Is(err, ErrUnknownKey) {
			log.Error("den: gateway key lookup", "key", fp, "err", err)
		}
		return false
	}
	st.mu.Lock()
	st.keys[fp] = user
	st.mu.Unlock()
	return true
}

// verified gives the connection the user of the key whose signature
// checked out. (A client may query other keys first, as anybody can:
// public keys are public. gliderlabs keeps one Permissions per
// connection, which the last query would set; this does not.)
func (st *connState) verified(key gossh.PublicKey) (*gossh.Permissions, error) {
	fp := gossh.FingerprintSHA256(key)
	st.mu.Lock()
	user, ok := st.keys[fp]
	st.mu.Unlock()
	if !ok {
		return nil, errors.New("key not looked up")
	}
	return &gossh.Permissions{Extensions: map[string]string{extUser: user, extKey: fp}}, nil
}

// rejectChannel refuses channel types the gateway does not relay.
func rejectChannel(_ *gliderssh.Server, _ *gossh.ServerConn, nc gossh.NewChannel, _ gliderssh.Context) {
	_ = nc.Reject(gossh.UnknownChannelType, fmt.Sprintf("den gateway: %s channels are not supported", nc.ChannelType()))
}
