package sshgw

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	gossh "golang.org/x/crypto/ssh"
)

func newSigner(t *testing.T) gossh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeAgent is a guest agent stand-in: "exit N" sessions print out/err
// and exit N; direct-tcpip channels echo.
func fakeAgent(t *testing.T) *gossh.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cfg := &gossh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(newSigner(t))
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, chans, reqs, err := gossh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		go gossh.DiscardRequests(reqs)
		for nc := range chans {
			go serveFake(nc)
		}
	}()
	cl, err := gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{User: "root", HostKeyCallback: gossh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func serveFake(nc gossh.NewChannel) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	if nc.ChannelType() == "direct-tcpip" {
		go gossh.DiscardRequests(reqs)
		_, _ = io.Copy(ch, ch)
		return
	}
	for req := range reqs {
		if req.Type != "exec" {
			_ = req.Reply(req.Type == "env", nil)
			continue
		}
		var p struct{ Command string }
		_ = gossh.Unmarshal(req.Payload, &p)
		_ = req.Reply(true, nil)
		var code uint32
		fmt.Sscanf(p.Command, "exit %d", &code)
		io.WriteString(ch, "out\n")
		io.WriteString(ch.Stderr(), "err\n")
		_, _ = ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{code}))
		return
	}
}

// fakeBackend: keys of users, VMs of users, counted claims.
type fakeBackend struct {
	keys     map[string]string // fingerprint -> user
	vms      map[string]string // vm -> owner
	agent    *gossh.Client
	opens    atomic.Int32
	releases atomic.Int32
}

func (b *fakeBackend) UserForKey(_ context.Context, fp string) (string, error) {
	if u, ok := b.keys[fp]; ok {
		return u, nil
	}
	return "", fmt.Errorf("key %s: %w", fp, ErrUnknownKey)
}

func (b *fakeBackend) Open(_ context.Context, vm, user string) (*Upstream, error) {
	if b.vms[vm] != user {
		return nil, fmt.Errorf("vm %q: %w", vm, ErrNoVM)
	}
	b.opens.Add(1)
	return &Upstream{Conn: b.agent, Done: make(chan struct{}), Release: func() { b.releases.Add(1) }}, nil
}

type fixture struct {
	srv          *Server
	b            *fakeBackend
	alice, bob   gossh.Signer
	hostKey      gossh.Signer
	unregistered gossh.Signer
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	f := &fixture{alice: newSigner(t), bob: newSigner(t), hostKey: newSigner(t), unregistered: newSigner(t)}
	f.b = &fakeBackend{
		keys: map[string]string{
			gossh.FingerprintSHA256(f.alice.PublicKey()): "alice",
			gossh.FingerprintSHA256(f.bob.PublicKey()):   "bob",
		},
		vms:   map[string]string{"box": "alice", "bobs": "bob"},
		agent: fakeAgent(t),
	}
	cfg := Config{HostKey: f.hostKey, Backend: f.b}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	f.srv = srv
	return f
}

func (f *fixture) dial(user string, key gossh.Signer) (*gossh.Client, error) {
	return gossh.Dial("tcp", f.srv.Addr().String(), &gossh.ClientConfig{
		User: user, Auth: []gossh.AuthMethod{gossh.PublicKeys(key)},
		HostKeyCallback: gossh.FixedHostKey(f.hostKey.PublicKey()), Timeout: 10 * time.Second,
	})
}

// run execs cmd on a new session: stdout, stderr, exit status.
func run(t *testing.T, c *gossh.Client, cmd string) (string, string, int) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errb bytes.Buffer
	s.Stdout, s.Stderr = &out, &errb
	err = s.Run(cmd)
	var ee *gossh.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitStatus()
	}
	t.Fatalf("run %q: %v", cmd, err)
	return "", "", 0
}

func TestRouting(t *testing.T) {
	f := newFixture(t, nil)
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // three channels, one claim
		if out, errs, code := run(t, c, "exit 3"); out != "out\n" || errs != "err\n" || code != 3 {
			t.Fatalf("exec: %q %q %d", out, errs, code)
		}
	}
	fwd, err := c.Dial("tcp", "127.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(fwd, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(fwd, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("direct-tcpip echo: %q %v", buf, err)
	}
	fwd.Close()
	if n := f.b.opens.Load(); n != 1 {
		t.Fatalf("%d claims for one connection", n)
	}
	c.Close()
	testutil.WaitFor(t, "the expected state", func() bool { return f.b.releases.Load() == 1 })

	// Not yours and not there: the same answer, exit 255.
	msg := func(user string, key gossh.Signer, vm string) string {
		c, err := f.dial(vm, key)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		out, errs, code := run(t, c, "exit 0")
		if out != "" || code != 255 {
			t.Fatalf("%s@%s: out %q code %d", user, vm, out, code)
		}
		return strings.ReplaceAll(errs, vm, "VM")
	}
	notYours, missing := msg("bob", f.bob, "box"), msg("bob", f.bob, "ghost")
	if notYours != missing || notYours != "den: no vm named \"VM\" for user \"bob\"\n" {
		t.Fatalf("not yours %q vs missing %q", notYours, missing)
	}
	if c, err := f.dial("box", f.bob); err == nil {
		if _, err := c.Dial("tcp", "127.0.0.1:80"); err == nil || !strings.Contains(err.Error(), `no vm named`) {
			t.Fatalf("forward to another user's vm: %v", err)
		}
		c.Close()
	}

	// An unregistered key does not get in at all.
	if _, err := f.dial("box", f.unregistered); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("unregistered key: %v", err)
	}
}

// A client may query any public key; the user is the one of the key it
// signed with.
func TestVerifiedKeyDecidesUser(t *testing.T) {
	f := newFixture(t, nil)
	st := &connState{keys: map[string]string{}}
	ctx := context.Background()
	for _, k := range []gossh.Signer{f.bob, f.alice} { // bob's, then alice's queried
		if !st.lookup(ctx, f.b, k.PublicKey(), f.srv.noisy) {
			t.Fatal("registered key refused")
		}
	}
	if st.lookup(ctx, f.b, f.unregistered.PublicKey(), f.srv.noisy) {
		t.Fatal("unregistered key admitted")
	}
	perms, err := st.verified(f.bob.PublicKey()) // bob's signed
	if err != nil || perms.Extensions[extUser] != "bob" {
		t.Fatalf("verified bob: %+v %v", perms, err)
	}
	if _, err := st.verified(f.unregistered.PublicKey()); err == nil {
		t.Fatal("a key never looked up was verified")
	}
}

func TestAgentForwardingRefused(t *testing.T) {
	f := newFixture(t, nil)
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	s.Stdout, s.Stderr = &out, &errb
	if ok, err := s.SendRequest("auth-agent-req@openssh.com", true, nil); ok || err != nil {
		t.Fatalf("agent forwarding: ok %v err %v", ok, err)
	}
	if err := s.Run("exit 0"); err != nil || out.String() != "out\n" {
		t.Fatalf("session after -A: %q %v", out.String(), err)
	}
	if !strings.HasPrefix(errb.String(), agentRefused) {
		t.Fatalf("stderr: %q", errb.String())
	}
}

func TestHandshakeLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.MaxUnauthenticated = 2
		c.HandshakeTimeout = 500 * time.Millisecond
	})
	var conns []net.Conn
	for i := 0; i < 2; i++ {
		c := f.raw(t, "127.0.0.1")
		if !versionLine(c) {
			t.Fatalf("connection %d under the limit refused", i)
		}
		conns = append(conns, c)
	}
	// A third silent client is admitted, and the oldest of the address
	// with the most is closed to make room.
	third := f.raw(t, "127.0.0.1")
	if !versionLine(third) {
		t.Fatal("a newcomer at the limit refused")
	}
	if !closedByServer(conns[0]) {
		t.Fatal("the oldest connection was not closed")
	}
	// The silent ones are dropped at the handshake timeout ...
	for _, c := range []net.Conn{conns[1], third} {
		if !closedByServer(c) {
			t.Fatal("silent connection not closed")
		}
	}
	// ... which frees their slots; an authenticated one keeps none.
	var clients []*gossh.Client
	for i := 0; i < 4; i++ {
		cl, err := f.dial("box", f.alice)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients = append(clients, cl)
	}
	// One opened after them is closed at its timeout; theirs has passed
	// too by then.
	late := f.raw(t, "127.0.0.1")
	if !versionLine(late) || !closedByServer(late) {
		t.Fatal("a silent connection after the logins was not closed")
	}
	for _, cl := range clients {
		if _, _, code := run(t, cl, "exit 5"); code != 5 {
			t.Errorf("exec after the handshake timeout: %d", code)
		}
	}
}

// raw opens a TCP connection to the gateway from the loopback address
// from (127.0.0.1, 127.0.0.2...: distinct sources), closed at the end of
// the test.
func (f *fixture) raw(t *testing.T, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", f.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialFrom logs in as user with key from the loopback address from.
func (f *fixture) dialFrom(t *testing.T, from, user string, keys ...gossh.Signer) (*gossh.Client, error) {
	t.Helper()
	conn, chans, reqs, err := gossh.NewClientConn(f.raw(t, from), f.srv.Addr().String(), &gossh.ClientConfig{
		User: user, Auth: []gossh.AuthMethod{gossh.PublicKeys(keys...)},
		HostKeyCallback: gossh.FixedHostKey(f.hostKey.PublicKey()), Timeout: 10 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	c := gossh.NewClient(conn, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c, nil
}

// versionLine says whether the gateway admitted c: it sent its version
// line (within 5s).
func versionLine(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line := make([]byte, 8)
	_, err := io.ReadFull(c, line)
	return err == nil && string(line) == "SSH-2.0-"
}

// closedByServer says whether the gateway closed c within 5s (what it
// sent before is read and dropped).
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	return err == nil
}

func TestIdleTimeout(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("idle connection not closed")
	}
}
