package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

// DefaultHandshakeTimeout bounds Dial's SSH handshake when the context
// has no earlier deadline.
const DefaultHandshakeTimeout = 15 * time.Second

// DefaultCallTimeout bounds a control request whose context has no
// deadline.
const DefaultCallTimeout = 30 * time.Second

// DialOption changes how Dial connects.
type DialOption func(*dialOptions)

type dialOptions struct {
	hostKey   ssh.HostKeyCallback
	user      string
	timeout   time.Duration
	keepalive time.Duration
	setClock  bool
	identity  *IdentityRequest
}

// WithHostKeyCallback checks the agent's host key (default: accept any;
// the guest channel is private to the host). See PinnedHostKey.
func WithHostKeyCallback(cb ssh.HostKeyCallback) DialOption {
	return func(o *dialOptions) { o.hostKey = cb }
}

// WithUser logs in as a guest account other than root.
func WithUser(user string) DialOption {
	return func(o *dialOptions) { o.user = user }
}

// WithKeepalive sends a keepalive every interval and closes the
// connection when one goes unanswered for 3 intervals (an agent that
// restarted, a guest that hung), so that Done fires. Off by default.
// Control requests share one queue with keepalives: keep interval well
// above the longest request (a freeze syncs the disks).
func WithKeepalive(interval time.Duration) DialOption {
	return func(o *dialOptions) { o.keepalive = interval }
}

// WithClockSet makes WaitReady's ready request set the guest's wall
// clock to the host's time as it is sent, in the same round trip:
// ReadyInfo.Clock says how, or is nil (see there). Dial ignores it.
func WithClockSet() DialOption {
	return func(o *dialOptions) { o.setClock = true }
}

// WithIdentity makes WaitReady's ready request give the guest a new
// identity (as NewIdentityWith, its Entropy filled in), after the clock,
// in the same round trip: ReadyInfo.Identity says how, or is nil (see
// there). Dial ignores it.
func WithIdentity(req IdentityRequest) DialOption {
	return func(o *dialOptions) { o.identity = &req }
}

// Client is an SSH connection to a guest agent. Its methods may be called
// concurrently.
type Client struct {
	ssh     *ssh.Client
	conn    net.Conn
	version string
	done    chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// Dial runs the SSH handshake with the agent over conn, a stream the
// caller got from the VMM's guest channel, authenticating with signer.
// The handshake is bounded by ctx and the handshake timeout; on failure
// conn is closed. Bytes the agent sent before its version line for this
// connection (leftovers of an earlier one on a serial port) are skipped.
func Dial(ctx context.Context, conn net.Conn, signer ssh.Signer, opts ...DialOption) (*Client, error) {
	o := dialOptions{hostKey: ssh.InsecureIgnoreHostKey(), user: DefaultUser, timeout: DefaultHandshakeTimeout}
	for _, f := range opts {
		f(&o)
	}
	nonce := newNonce()
	cfg := &ssh.ClientConfig{
		User:            o.user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: o.hostKey,
		ClientVersion:   clientVersion(nonce),
	}
	// Closing conn is the only way to interrupt a handshake on any
	// net.Conn, whether or not it supports deadlines.
	var aborted atomic.Bool
	abort := func() {
		if aborted.CompareAndSwap(false, true) {
			conn.Close()
		}
	}
	timer := time.AfterFunc(o.timeout, abort)
	stop := context.AfterFunc(ctx, abort)
	sc, chans, reqs, err := ssh.NewClientConn(newSyncConn(conn, nonce), "den-agent", cfg)
	timer.Stop()
	stop()
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent handshake: %w", ctx.Err())
		}
		return nil, fmt.Errorf("agent handshake: %w", err)
	}
	// A timer that fired right after the handshake closed conn.
	if !aborted.CompareAndSwap(false, true) {
		sc.Close()
		return nil, fmt.Errorf("agent handshake: timed out")
	}
	c := &Client{
		ssh:     ssh.NewClient(sc, chans, reqs),
		conn:    conn,
		version: string(sc.ServerVersion()),
		done:    make(chan struct{}),
	}
	go func() {
		c.ssh.Wait()
		close(c.done)
	}()
	if o.keepalive > 0 {
		go c.keepalive(o.keepalive)
	}
	return c, nil
}

// FromSSH wraps an SSH connection to a guest agent that was made
// elsewhere (the daemon's relay: api.Client.SSH), so that Exec, Shell and
// SFTP run over it as over one Dial made. Close closes sc.
func FromSSH(sc *ssh.Client) *Client {
	c := &Client{ssh: sc, version: string(sc.ServerVersion()), done: make(chan struct{})}
	go func() {
		sc.Wait()
		close(c.done)
	}()
	return c
}

func (c *Client) keepalive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*interval)
		err := c.call(ctx, "keepalive@openssh.com", nil, nil)
		cancel()
		if err != nil && !errors.Is(err, ErrUnsupported) {
			c.Close()
			return
		}
	}
}

// ServerVersion is the agent's SSH version line.
func (c *Client) ServerVersion() string { return c.version }

// SSH is the underlying SSH client, for callers that proxy channels (the
// SSH gateway).
func (c *Client) SSH() *ssh.Client { return c.ssh }

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the connection and every session on it.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.ssh.Close()
		if errors.Is(c.closeErr, net.ErrClosed) {
			c.closeErr = nil
		}
	})
	return c.closeErr
}

// SFTP opens an SFTP session.
func (c *Client) SFTP() (*sftp.Client, error) {
	sc, err := sftp.NewClient(c.ssh)
	if err != nil {
		return nil, fmt.Errorf("agent sftp: %w", err)
	}
	return sc, nil
}

// DialTCP connects to addr (host:port) from inside the guest over a
// direct-tcpip channel. The returned conn supports CloseWrite.
func (c *Client) DialTCP(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := c.ssh.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent dial %s: %w", addr, err)
	}
	return conn, nil
}

// call sends a control request and decodes its result into resp (which
// may be nil).
func (c *Client) call(ctx context.Context, name string, req, resp any) error {
	select {
	case <-c.done:
		return fmt.Errorf("agent %s: %w", name, ErrClosed)
	default:
	}
	var payload []byte
	if req != nil {
		var err error
		if payload, err = json.Marshal(req); err != nil {
			return fmt.Errorf("agent %s: %w", name, err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		defer cancel()
	}
	type result struct {
		ok   bool
		data []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		ok, data, err := c.ssh.SendRequest(name, true, payload)
		ch <- result{ok, data, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("agent %s: %w", name, ctx.Err())
	case <-c.done:
		select {
		case r = <-ch:
		default:
			return fmt.Errorf("agent %s: %w", name, ErrClosed)
		}
	}
	switch {
	case r.err != nil:
		return fmt.Errorf("agent %s: %w", name, r.err)
	case !r.ok && len(r.data) == 0:
		return fmt.Errorf("agent %s: %w", name, ErrUnsupported)
	case !r.ok:
		return fmt.Errorf("agent %s: %s", name, r.data)
	}
	if resp != nil {
		if err := json.Unmarshal(r.data, resp); err != nil {
			return fmt.Errorf("agent %s: decode reply: %w", name, err)
		}
	}
	return nil
}

var (
	// ErrUnsupported is wrapped when the agent does not know a control
	// request (an older agent).
	ErrUnsupported = errors.New("request not supported by the agent")
	// ErrClosed is wrapped by calls on a connection that has ended.
	ErrClosed = errors.New("agent connection closed")
)

// SetSecrets gives the guest its HTTPS secrets' placeholders and CA.
func (c *Client) SetSecrets(ctx context.Context, req SecretsRequest) (SecretsReply, error) {
	var out SecretsReply
	return out, c.call(ctx, ReqSecrets, req, &out)
}

// ServeKeyAgent serves den's SSH secrets to the guest on this
// connection: it tells the agent so (ReqKeyAgent), and hands serve each
// channel the agent opens for a connection to its SSH agent socket, in
// a goroutine of its own, closing it when serve returns. An agent older
// than the request answers ErrUnsupported.
func (c *Client) ServeKeyAgent(ctx context.Context, serve func(io.ReadWriter)) error {
	chans := c.ssh.HandleChannelOpen(ChanKeyAgent)
	if chans == nil {
		return errors.New("ssh agent channels: served already on this connection")
	}
	go func() {
		for nc := range chans {
			ch, reqs, err := nc.Accept()
			if err != nil {
				continue
			}
			go ssh.DiscardRequests(reqs)
			go func() {
				defer ch.Close()
				serve(ch)
			}()
		}
	}()
	return c.call(ctx, ReqKeyAgent, nil, nil)
}
