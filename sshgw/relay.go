package sshgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/sshrelay"
)

// connState is one client connection's: its handshake, the keys looked up
// for it, and its claim on the VM.
type connState struct {
	authed        atomic.Bool
	triedAuth     atomic.Bool // an authentication other than "none" failed
	timer         *time.Timer
	releaseSlot   func()
	channels      atomic.Int32 // open at once
	overCap       atomic.Bool  // a channel over MaxChannels was logged
	forwards      atomic.Int32 // direct-tcpip channels open at once
	overForwards  atomic.Bool  // a forward over MaxForwards was logged
	remoteRefused atomic.Bool  // a -R was refused (and said why)
	sessionOpen   chan struct{}
	sessionOnce   sync.Once

	mu      sync.Mutex
	keys    map[string]string // fingerprint -> user, for this handshake
	once    sync.Once
	up      *Upstream
	err     error
	closed  bool
	session gossh.Channel // the session accepted last, for notices
}

// open claims the VM once per connection, at its first channel; first
// says whether this call made the claim.
func (st *connState) open(ctx context.Context, b Backend, vm, user string) (up *Upstream, first bool, err error) {
	st.once.Do(func() {
		first = true
		up, err := b.Open(ctx, vm, user)
		st.mu.Lock()
		defer st.mu.Unlock()
		switch {
		case err != nil:
			st.err = err
		case st.closed: // the client left while the VM woke
			up.Release()
			st.err = errors.New("connection closed")
		default:
			st.up = up
		}
	})
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err == nil && st.up == nil {
		return nil, first, errors.New("connection closed")
	}
	return st.up, first, st.err
}

// close releases the VM claim when the connection has ended.
func (st *connState) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	if st.up != nil {
		st.up.Release()
		st.up = nil
	}
}

// channel handles a session or direct-tcpip channel of an authenticated
// connection.
func (s *Server) channel(_ *gliderssh.Server, conn *gossh.ServerConn, nc gossh.NewChannel, ctx gliderssh.Context) {
	st := state(ctx)
	user := ""
	if conn.Permissions != nil {
		user = conn.Permissions.Extensions[extUser]
	}
	if st == nil || user == "" {
		_ = nc.Reject(gossh.Prohibited, "not authenticated")
		return
	}
	if n := st.channels.Add(1); int(n) > s.cfg.MaxChannels {
		st.channels.Add(-1)
		if !st.overCap.Swap(true) { // once a connection
			s.log.Warn("den: ssh gateway: too many channels on one connection, rejecting one", "remote", conn.RemoteAddr().String(), "user", user, "limit", s.cfg.MaxChannels)
		}
		_ = nc.Reject(gossh.ResourceShortage, fmt.Sprintf("den: too many channels open on this connection (the limit is %d)", s.cfg.MaxChannels))
		return
	}
	defer st.channels.Add(-1)
	if nc.ChannelType() == "direct-tcpip" {
		if n := st.forwards.Add(1); int(n) > s.cfg.MaxForwards {
			st.forwards.Add(-1)
			if !st.overForwards.Swap(true) { // once a connection
				s.log.Warn("den: ssh gateway: too many forwards on one connection, rejecting one", "remote", conn.RemoteAddr().String(), "user", user, "limit", s.cfg.MaxForwards)
			}
			_ = nc.Reject(gossh.ResourceShortage, fmt.Sprintf("den: too many forwards open on this connection (the limit is %d)", s.cfg.MaxForwards))
			return
		}
		defer st.forwards.Add(-1)
	}
	vm := conn.User()
	if vm == DenUser {
		if nc.ChannelType() != "session" || s.cfg.Den == nil {
			_ = nc.Reject(gossh.Prohibited, "den: "+DenUser+"@ runs den commands only (ssh "+DenUser+"@HOST ls)")
			return
		}
		s.cfg.Den.serve(ctx, sessionChannel{nc, st, false}, user, conn.RemoteAddr().String(), s.log)
		return
	}
	if err := validate.VMName(vm); err != nil {
		refuse(nc, "den: "+err.Error()) // quoted cut short: never echoed whole
		return
	}
	start := time.Now()
	up, first, err := st.open(ctx, s.cfg.Backend, vm, user)
	if err != nil {
		msg := "den: " + err.Error()
		if errors.Is(err, ErrNoVM) {
			msg = fmt.Sprintf("den: no vm named %q for user %q", vm, user)
		}
		if first {
			s.log.Info("den: gateway refused", "vm", vm, "user", user, "remote", conn.RemoteAddr().String(), "err", err)
		}
		refuse(nc, msg)
		return
	}
	if first {
		s.log.Info("den: gateway session", "vm", vm, "user", user, "key", conn.Permissions.Extensions[extKey],
			"remote", conn.RemoteAddr().String(), "open", time.Since(start).Round(time.Millisecond))
		// The VM stopping ends the client's connection too.
		go func() {
			select {
			case <-up.Done:
				conn.Close()
			case <-ctx.Done():
			}
		}()
	}
	if nc.ChannelType() == "session" {
		nc = sessionChannel{nc, st, true}
	}
	sshrelay.RelayChannel(nc, up.Conn, sshrelay.Hooks{Logger: s.log})
}

// refuse answers a channel with msg: a session gets it on stderr and exit
// status 255 (what OpenSSH shows as one line, as it does for its own
// errors), a forward gets it as the open failure.
func refuse(nc gossh.NewChannel, msg string) {
	if nc.ChannelType() != "session" {
		_ = nc.Reject(gossh.ConnectionFailed, msg)
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	// Take the session's setup (pty, env) until it asks for a shell,
	// command or subsystem, so that the client sets up quietly and shows
	// the message, not a complaint about a refused pty.
	tty := false
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
wait:
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				return
			}
			started := req.Type == "shell" || req.Type == "exec" || req.Type == "subsystem"
			tty = tty || req.Type == "pty-req"
			if req.WantReply {
				_ = req.Reply(req.Type != "auth-agent-req@openssh.com", nil)
			}
			if started {
				break wait
			}
		case <-timeout.C:
			break wait
		}
	}
	go gossh.DiscardRequests(reqs)
	eol := "\n"
	if tty {
		eol = "\r\n"
	}
	_, _ = io.WriteString(ch.Stderr(), msg+eol)
	_, _ = ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{255}))
	_ = ch.CloseWrite()
}

// agentRefused is what a client asking for agent forwarding is told.
const agentRefused = "den: agent forwarding (-A) is not available through the gateway; going on without it"

// sessionChannel is a session channel of the connection st: once
// accepted it takes the connection's notices (see notify), and if
// noAgent it refuses agent forwarding requests (with a line on the
// client's stderr: OpenSSH asks without wanting a reply, so it would
// never know) and passes every other request on.
type sessionChannel struct {
	gossh.NewChannel
	st      *connState
	noAgent bool
}

func (n sessionChannel) Accept() (gossh.Channel, <-chan *gossh.Request, error) {
	ch, reqs, err := n.NewChannel.Accept()
	if err != nil {
		return ch, reqs, err
	}
	n.st.mu.Lock()
	n.st.session = ch
	n.st.mu.Unlock()
	n.st.sessionOnce.Do(func() { close(n.st.sessionOpen) })
	if !n.noAgent {
		return ch, reqs, nil
	}
	out := make(chan *gossh.Request)
	go func() {
		defer close(out)
		for req := range reqs {
			if req.Type == "auth-agent-req@openssh.com" {
				if req.WantReply {
					_ = req.Reply(false, nil)
				}
				_, _ = io.WriteString(ch.Stderr(), agentRefused+"\r\n")
				continue
			}
			out <- req
		}
	}()
	return ch, out, nil
}

// notify writes msg on the stderr of the connection's last session,
// waiting for one to open, and returns once the client has read it (it
// answered a request sent after it), or after within at most, or when
// the connection ends. A client that is told something in the answer to
// a global request, which carries no message, is told why this way.
//
// Answering before the client has read the line could lose it: OpenSSH
// with ExitOnForwardFailure exits at a refused -R as soon as it reads the
// refusal, and what it read with it for its stderr is never written.
func (st *connState) notify(ctx context.Context, msg string, within time.Duration) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	select {
	case <-st.sessionOpen:
	case <-deadline.C:
		return
	case <-ctx.Done():
		return
	}
	st.mu.Lock()
	ch := st.session
	st.mu.Unlock()
	if _, err := io.WriteString(ch.Stderr(), msg+"\r\n"); err != nil {
		return
	}
	read := make(chan struct{})
	go func() {
		// Any answer will do (OpenSSH and x/crypto/ssh answer failure);
		// it comes after the client took the line.
		_, _ = ch.SendRequest("keepalive@openssh.com", true, nil)
		close(read)
	}()
	select {
	case <-read:
	case <-deadline.C:
	case <-ctx.Done():
	}
}
