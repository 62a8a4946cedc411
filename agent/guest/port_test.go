//go:build linux

package guest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/testutil"
)

// fakePort behaves like /dev/vportNpM with QEMU's server socket chardev
// behind it: hosts connect (Connect) and go; the guest reads EOF while no
// host is connected and blocks writing until one is.
type fakePort struct {
	mu      sync.Mutex
	cond    *sync.Cond
	toGuest []byte
	host    *fakeHost
	closed  bool
	maxRead int
}

func newFakePort(maxRead int) *fakePort {
	p := &fakePort{maxRead: maxRead}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *fakePort) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.toGuest) == 0 && p.host != nil && !p.closed {
		p.cond.Wait()
	}
	if p.closed {
		return 0, os.ErrClosed
	}
	if len(p.toGuest) == 0 {
		return 0, io.EOF
	}
	if p.maxRead > 0 && len(b) > p.maxRead {
		b = b[:p.maxRead]
	}
	n := copy(b, p.toGuest)
	p.toGuest = p.toGuest[n:]
	return n, nil
}

func (p *fakePort) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.host == nil && !p.closed {
		p.cond.Wait()
	}
	if p.closed {
		return 0, os.ErrClosed
	}
	p.host.in = append(p.host.in, b...)
	p.cond.Broadcast()
	return len(b), nil
}

func (p *fakePort) Close() error {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	return nil
}

// Connect is a host connecting; an earlier host is replaced without the
// guest seeing it go (as after a restore into a new VMM).
func (p *fakePort) Connect() *fakeHost {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := &fakeHost{p: p}
	p.host = h
	p.cond.Broadcast()
	return h
}

// inject puts bytes on the current host's side as if the guest had sent
// them (the tail of an older connection).
func (p *fakePort) inject(b []byte) {
	p.mu.Lock()
	p.host.in = append(p.host.in, b...)
	p.cond.Broadcast()
	p.mu.Unlock()
}

// fakeHost is the host's end of one connection.
type fakeHost struct {
	p      *fakePort
	in     []byte
	closed bool
}

func (h *fakeHost) Read(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(h.in) == 0 && !h.closed && p.host == h {
		p.cond.Wait()
	}
	if len(h.in) == 0 {
		return 0, io.EOF
	}
	n := copy(b, h.in)
	h.in = h.in[n:]
	return n, nil
}

func (h *fakeHost) Write(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.closed || p.host != h {
		return 0, net.ErrClosed
	}
	p.toGuest = append(p.toGuest, b...)
	p.cond.Broadcast()
	return len(b), nil
}

func (h *fakeHost) Close() error {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	h.closed = true
	if p.host == h {
		p.host = nil
	}
	p.cond.Broadcast()
	return nil
}

func (h *fakeHost) LocalAddr() net.Addr              { return portAddr{} }
func (h *fakeHost) RemoteAddr() net.Addr             { return portAddr{} }
func (h *fakeHost) SetDeadline(time.Time) error      { return nil }
func (h *fakeHost) SetReadDeadline(time.Time) error  { return nil }
func (h *fakeHost) SetWriteDeadline(time.Time) error { return nil }

func servePort(t *testing.T, h *harness, p Port) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.srv.ServePort(ctx, p)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServePort did not return")
		}
	})
}

func dialPort(t *testing.T, h *harness, conn net.Conn) *agent.Client {
	t.Helper()
	c, err := agent.Dial(testCtx(t), conn, h.clientKey, agent.WithUser(h.user))
	if err != nil {
		t.Fatalf("dial over the serial port: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Ready(testCtx(t)); err != nil {
		t.Fatalf("ready over the serial port: %v", err)
	}
	return c
}

func TestSerialPortSequenceOfConnections(t *testing.T) {
	h := newHarness(t)
	p := newFakePort(0)
	servePort(t, h, p)

	// First host: a command, then it leaves.
	a := dialPort(t, h, p.Connect())
	if code, out, _ := run(t, a, agent.ExecRequest{CmdLine: "echo one; exit 4"}); code != 4 || out != "one\n" {
		t.Fatalf("first connection: %d %q", code, out)
	}
	a.Close()

	// Second host after a clean disconnect; it leaves a command running.
	b := dialPort(t, h, p.Connect())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, agent.ExecRequest{CmdLine: "sleep 20"})
		bDone <- err
	}()
	testutil.WaitForWithin(t, 10*time.Second, "b's session", func() bool { return h.srv.Sessions() == 1 })
	// The host writes a little more that the guest never reads...
	b.SSH().SendRequest("keepalive@openssh.com", false, nil)

	// ...then a restore: a new host connects without the guest seeing
	// the old one leave, and stale bytes of the old connection reach it
	// first, including an old agent version line.
	cConn := p.Connect()
	p.inject([]byte("\x00\x01garbage SSH-2.0-denagent_0 0123456789abcdef\r\n\x17\x99tail of old stream"))
	c := dialPort(t, h, cConn)
	if code, out, _ := run(t, c, agent.ExecRequest{CmdLine: "echo three"}); code != 0 || out != "three\n" {
		t.Fatalf("after reconnect: %d %q", code, out)
	}
	// The old connection's session was hung up.
	testutil.WaitForWithin(t, 15*time.Second, "old session to end", func() bool { return h.srv.Sessions() == 0 })
	b.Close()
	select {
	case <-bDone:
	case <-time.After(10 * time.Second):
		t.Error("old exec did not end")
	}
}

func TestSerialPortSmallReads(t *testing.T) {
	h := newHarness(t)
	p := newFakePort(3) // version lines split across reads
	servePort(t, h, p)
	host := p.Connect()
	host.Write([]byte("noise before any connection SSH-2.0-"))
	a := dialPort(t, h, host)
	if code, out, _ := run(t, a, agent.ExecRequest{CmdLine: "echo small"}); code != 0 || out != "small\n" {
		t.Fatalf("exec: %d %q", code, out)
	}
	// A second connection whose version line arrives split, right
	// behind the first connection's bytes.
	b := dialPort(t, h, p.Connect())
	if code, out, _ := run(t, b, agent.ExecRequest{CmdLine: "echo again"}); code != 0 || out != "again\n" {
		t.Fatalf("second exec: %d %q", code, out)
	}
}

func TestWaitReadyRetries(t *testing.T) {
	h := newHarness(t)
	p := newFakePort(0)
	attempts := 0
	dial := func(ctx context.Context) (net.Conn, error) {
		attempts++
		if attempts < 3 {
			return nil, io.ErrUnexpectedEOF // the VMM's channel is not up yet
		}
		return p.Connect(), nil
	}
	// The agent starts serving only after the host is waiting.
	go func() {
		time.Sleep(300 * time.Millisecond)
		servePort(t, h, p)
	}()
	c, info, err := agent.WaitReady(testCtx(t), dial, h.clientKey, agent.WithUser(h.user))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info.Version != agent.Version || attempts < 3 {
		t.Errorf("ready %+v after %d attempts", info, attempts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, _, err = agent.WaitReady(ctx, func(context.Context) (net.Conn, error) { return nil, io.EOF }, h.clientKey)
	if err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("bounded WaitReady: %v", err)
	}
}

// TestKeepaliveNoticesDeadAgent: the agent stops answering (its process
// went away) while the host's stream stays open; the client's keepalive
// closes the connection.
func TestKeepaliveNoticesDeadAgent(t *testing.T) {
	h := newHarness(t)
	p := newFakePort(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.srv.ServePort(ctx, p)
	c, err := agent.Dial(testCtx(t), p.Connect(), h.clientKey, agent.WithUser(h.user), agent.WithKeepalive(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Ready(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // keepalives answered meanwhile
	select {
	case <-c.Done():
		t.Fatal("keepalive closed a live connection")
	default:
	}
	cancel() // the agent's port is gone; the host's side stays open
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("keepalive did not notice the dead agent")
	}
	if _, err := c.Ready(testCtx(t)); !errors.Is(err, agent.ErrClosed) {
		t.Errorf("ready on a dead connection: %v", err)
	}
}
