package sshgw

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/netlimit"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/sshrelay"
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
	Conn sshrelay.Opener
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
	// yet; a newcomer over it closes the oldest of the source address
	// that holds the most (default DefaultMaxUnauthenticated).
	MaxUnauthenticated int
	// MaxUnauthenticatedPerSource caps those of one source address; more
	// are closed at once (default DefaultMaxUnauthenticatedPerSource).
	MaxUnauthenticatedPerSource int
	// MaxAuthFailures connections of one source address that tried to
	// authenticate and failed, within AuthFailureWindow, have that
	// address's connections refused for AuthFailureBan (defaults
	// DefaultMaxAuthFailures, DefaultAuthFailureWindow,
	// DefaultAuthFailureBan).
	MaxAuthFailures   int
	AuthFailureWindow time.Duration
	AuthFailureBan    time.Duration
	// MaxChannels caps the channels open at once on one connection
	// (default DefaultMaxChannels).
	MaxChannels int
	// MaxForwards caps the forwards (direct-tcpip channels, -L and -D)
	// open at once on one connection, within MaxChannels (default
	// DefaultMaxForwards).
	MaxForwards int
	// UnauthLogBurst, UnauthLogEvery and UnauthLogSummary rate-limit the
	// log lines about unauthenticated connections: UnauthLogBurst at
	// once, then one per UnauthLogEvery; what is held back is summed up
	// in one line at most once per UnauthLogSummary (defaults
	// DefaultUnauthLogBurst, DefaultUnauthLogEvery,
	// DefaultUnauthLogSummary).
	UnauthLogBurst   int
	UnauthLogEvery   time.Duration
	UnauthLogSummary time.Duration
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
	// once. It is well above what legitimate clients need (a login
	// takes milliseconds), so that a flood from many addresses
	// (DefaultMaxUnauthenticatedPerSource each) fills it only with many
	// of them; when it is full a newcomer is admitted and the oldest
	// unauthenticated connection of the address holding the most is
	// closed, so a flood pushes out its own connections, not a login
	// from elsewhere. Each one costs a goroutine and a handshake's
	// buffers until DefaultHandshakeTimeout at most.
	DefaultMaxUnauthenticated = 256
	// DefaultMaxUnauthenticatedPerSource of those may come from one
	// source address (an IPv4 address, or an IPv6 /64), so that one
	// address cannot take every slot; more are closed at once, before
	// the SSH version line.
	DefaultMaxUnauthenticatedPerSource = 8
	// DefaultMaxAuthFailures connections from one source address that
	// try to authenticate and end without succeeding, within
	// DefaultAuthFailureWindow, have that address's new connections
	// closed at once for DefaultAuthFailureBan. A connection counts
	// once however many keys it tried (OpenSSH offers each key of its
	// agent in turn), and one that never tried (a port scan) does not
	// count. Other addresses are not affected.
	DefaultMaxAuthFailures = 10
	// DefaultAuthFailureWindow: see DefaultMaxAuthFailures.
	DefaultAuthFailureWindow = time.Minute
	// DefaultAuthFailureBan: see DefaultMaxAuthFailures.
	DefaultAuthFailureBan = 5 * time.Minute
	// maxFailureSources source addresses at most have their failures
	// counted; expired records are swept as failures come, and a full
	// table drops the record least recently added to (one that refuses
	// nothing, if any), so the table is bounded whatever the number of
	// addresses.
	maxFailureSources = 4096
	// DefaultMaxChannels channels (sessions and forwards) may be open at
	// once on one connection; more are rejected with ResourceShortage
	// and a message ("administratively prohibited" is not used: the
	// client may retry when one closes). It is also the most sessions
	// one OpenSSH ControlMaster connection can run at once.
	DefaultMaxChannels = 64
	// DefaultMaxForwards forwards (direct-tcpip channels: -L, -D) may be
	// open at once on one connection, so that forwards cannot take every
	// channel: sessions keep DefaultMaxChannels-DefaultMaxForwards.
	// More are rejected like channels over DefaultMaxChannels.
	DefaultMaxForwards = 48
	// DefaultUnauthLogBurst lines about unauthenticated connections
	// (refused, closed, failed handshakes) may be logged at once, then
	// one per DefaultUnauthLogEvery; the lines held back are summed up
	// in one line (how many of each) at most once per
	// DefaultUnauthLogSummary. A flood, however long, adds about 13
	// lines a minute to the log.
	DefaultUnauthLogBurst = 20
	// DefaultUnauthLogEvery: see DefaultUnauthLogBurst.
	DefaultUnauthLogEvery = 5 * time.Second
	// DefaultUnauthLogSummary: see DefaultUnauthLogBurst.
	DefaultUnauthLogSummary = time.Minute
	// noticeWait bounds how long a refused global request (-R) waits for
	// a session on the connection to tell the client why on its stderr
	// (OpenSSH shows no message of a refused global request), and then
	// for the client to have it before the refusal: OpenSSH with
	// ExitOnForwardFailure exits at the refusal.
	noticeWait = 5 * time.Second
	// MaxUserName is the longest SSH user name (a VM name, or "den")
	// accepted, in bytes: a longer one fails authentication, with a
	// banner that says why, and is logged cut short.
	MaxUserName = 256
)

// Server is a running SSH gateway.
type Server struct {
	cfg   Config
	log   *slog.Logger
	noisy *netlimit.LogLimiter // for what unauthenticated connections cause
	fails *failures
	srv   *gliderssh.Server
	ln    net.Listener

	pend   *netlimit.Conns // unauthenticated connections
	done   chan struct{}
	closed atomic.Bool
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
	if cfg.MaxAuthFailures <= 0 {
		cfg.MaxAuthFailures = DefaultMaxAuthFailures
	}
	if cfg.AuthFailureWindow <= 0 {
		cfg.AuthFailureWindow = DefaultAuthFailureWindow
	}
	if cfg.AuthFailureBan <= 0 {
		cfg.AuthFailureBan = DefaultAuthFailureBan
	}
	if cfg.MaxChannels <= 0 {
		cfg.MaxChannels = DefaultMaxChannels
	}
	if cfg.MaxForwards <= 0 {
		cfg.MaxForwards = DefaultMaxForwards
	}
	if cfg.UnauthLogBurst <= 0 {
		cfg.UnauthLogBurst = DefaultUnauthLogBurst
	}
	if cfg.UnauthLogEvery <= 0 {
		cfg.UnauthLogEvery = DefaultUnauthLogEvery
	}
	if cfg.UnauthLogSummary <= 0 {
		cfg.UnauthLogSummary = DefaultUnauthLogSummary
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ssh gateway: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ln: ln, done: make(chan struct{}),
		pend:  netlimit.NewConns(cfg.MaxUnauthenticated, cfg.MaxUnauthenticatedPerSource),
		noisy: netlimit.NewLogLimiter(cfg.Logger, "ssh gateway", cfg.UnauthLogBurst, cfg.UnauthLogEvery, cfg.UnauthLogSummary),
		fails: newFailures(cfg.MaxAuthFailures, cfg.AuthFailureWindow, cfg.AuthFailureBan, maxFailureSources)}
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
		// Every other global request (keepalive@openssh.com...) is
		// answered with a failure.
		RequestHandlers: map[string]gliderssh.RequestHandler{
			"tcpip-forward":                   s.refuseRemoteForward,
			"streamlocal-forward@openssh.com": s.refuseRemoteForward,
		},
		ConnectionFailedCallback: func(c net.Conn, err error) {
			s.noisy.Log(slog.LevelDebug, "den: gateway handshake failed", "remote", c.RemoteAddr().String(), "err", err)
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
	s.noisy.Close()
	return err
}

type stateKey struct{}

// accept admits a new TCP connection unless its source address is
// refused (too many failed authentications) or already has
// MaxUnauthenticatedPerSource connections authenticating; at
// MaxUnauthenticated it makes room (see admit). It arms the handshake
// timeout, and counts the connection as a failure of its source if it
// ends after trying to authenticate and failing.
func (s *Server) accept(ctx gliderssh.Context, c net.Conn) net.Conn {
	src := netlimit.SourceOf(c.RemoteAddr())
	p, victim, err := s.admit(c, src, time.Now())
	if victim != nil {
		s.noisy.Log(slog.LevelWarn, "den: ssh gateway: too many unauthenticated connections, closing the oldest of the address with the most", "remote", victim.RemoteAddr().String(), "limit", s.cfg.MaxUnauthenticated)
		_ = victim.Close()
	}
	if err != nil {
		limit := s.cfg.MaxUnauthenticatedPerSource
		if errors.Is(err, errSourceRefused) {
			limit = s.cfg.MaxAuthFailures
		}
		s.noisy.Log(slog.LevelWarn, "den: ssh gateway: refusing a connection", "remote", c.RemoteAddr().String(), "err", err, "limit", limit)
		// A line before the version line, which the protocol allows
		// (OpenSSH shows it with -v).
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = fmt.Fprintf(c, "den: %v\r\n", err)
		return nil
	}
	st := &connState{keys: map[string]string{}, sessionOpen: make(chan struct{})}
	st.releaseSlot = func() { s.pend.Release(p) }
	st.timer = time.AfterFunc(s.cfg.HandshakeTimeout, func() {
		if !st.authed.Load() {
			s.noisy.Log(slog.LevelDebug, "den: gateway handshake timed out", "remote", c.RemoteAddr().String())
			c.Close()
		}
	})
	ctx.SetValue(stateKey{}, st)
	go func() {
		<-ctx.Done() // the connection ended
		st.timer.Stop()
		st.releaseSlot()
		st.close()
		if !st.authed.Load() && st.triedAuth.Load() && s.fails.add(src, time.Now()) {
			s.noisy.Log(slog.LevelWarn, "den: ssh gateway: too many failed authentications from one address, refusing its connections for a while",
				"source", src, "limit", s.cfg.MaxAuthFailures, "within", s.cfg.AuthFailureWindow, "for", s.cfg.AuthFailureBan)
		}
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
	return st != nil && st.lookup(ctx, s.cfg.Backend, key, s.noisy)
}

// banner is sent before the first authentication answer: empty, except
// for a user name over MaxUserName, which no key can log in as.
func (s *Server) banner(c gossh.ConnMetadata) string {
	if len(c.User()) <= MaxUserName {
		return ""
	}
	s.noisy.Log(slog.LevelWarn, "den: ssh gateway: user name too long, refusing", "remote", c.RemoteAddr().String(), "user", validate.Quote(c.User()), "limit", MaxUserName)
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
		AuthLogCallback: func(_ gossh.ConnMetadata, method string, err error) {
			switch {
			case err == nil:
				st.authed.Store(true)
				st.timer.Stop()
				st.releaseSlot()
			case method != "none": // every client asks "none" first
				st.triedAuth.Store(true)
			}
		},
	}
}

// lookup says whether some user registered key, and remembers whose it is.
func (st *connState) lookup(ctx context.Context, b Backend, key gossh.PublicKey, log *netlimit.LogLimiter) bool {
	fp := gossh.FingerprintSHA256(key)
	user, err := b.UserForKey(ctx, fp)
	if err != nil {
		if !errors.Is(err, ErrUnknownKey) {
			log.Log(slog.LevelError, "den: gateway key lookup", "key", fp, "err", err)
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
	if nc.ChannelType() == "direct-streamlocal@openssh.com" {
		_ = nc.Reject(gossh.Prohibited, streamlocalRefused)
		return
	}
	_ = nc.Reject(gossh.UnknownChannelType, fmt.Sprintf("den gateway: %s channels are not supported", nc.ChannelType()))
}

// What a client asking for forwards the gateway does not offer is told.
const (
	remoteForwardRefused = "den: remote forwarding (-R) is not available through the gateway"
	streamlocalRefused   = "den: forwarding to a unix socket is not available through the gateway"
)

// refuseRemoteForward answers a tcpip-forward or streamlocal-forward
// request (-R) with a failure, which OpenSSH shows without a reason. So
// the first one of a connection first tells the client why on the
// stderr of its session (see connState.notify).
func (s *Server) refuseRemoteForward(ctx gliderssh.Context, _ *gliderssh.Server, req *gossh.Request) (bool, []byte) {
	st := state(ctx)
	if st == nil || st.remoteRefused.Swap(true) {
		return false, nil
	}
	s.log.Info("den: ssh gateway: remote forwarding refused", "user", ctx.User(), "remote", ctx.RemoteAddr().String(), "request", req.Type)
	st.notify(ctx, remoteForwardRefused, noticeWait)
	return false, nil
}
