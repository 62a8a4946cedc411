package cloudhypervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/denhq/den/vmm"
)

// DialGuest connects to a port of the guest through Cloud Hypervisor's
// hybrid vsock: it dials the run directory's vsock socket, sends
// "CONNECT <port>\n" and waits for "OK <assigned>\n". When nothing in the
// guest listens on the port Cloud Hypervisor answers nothing at all, so
// the wait is bounded by Options.GuestDialTimeout (or ctx, if sooner) and
// then fails wrapping vmm.ErrNoGuestListener.
//
// The connection does not survive a restore or a VMM restart: callers
// redial.
func (v *VMM) DialGuest(ctx context.Context, port uint32) (net.Conn, error) {
	deadline := time.Now().Add(v.opts.GuestDialTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	sock := v.opts.RunDir.VsockSocket()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		if p := v.process(); p != nil && !p.Alive() {
			return nil, fmt.Errorf("dial guest port %d: %w (%v)%s", port, vmm.ErrNotRunning, p.Err(), v.logNote())
		}
		return nil, fmt.Errorf("dial guest port %d: vsock socket: %w", port, err)
	}
	conn, err := vsockHandshake(ctx, c, port)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("dial guest port %d via %s: %w", port, sock, err)
	}
	return conn, nil
}

// vsockHandshake runs the CONNECT exchange on c before ctx ends and
// returns the connection, with whatever was read past the OK line still
// to be read.
func vsockHandshake(ctx context.Context, c net.Conn, port uint32) (net.Conn, error) {
	dl, _ := ctx.Deadline()
	if err := c.SetDeadline(dl); err != nil {
		return nil, err
	}
	// A cancelled ctx (not only its deadline) ends the wait too.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	start := time.Now()
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		return nil, fmt.Errorf("send CONNECT: %w", err)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		waited := time.Since(start).Round(time.Millisecond)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == context.Canceled:
			return nil, fmt.Errorf("waiting for OK: %w", context.Canceled)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("no OK after %s (nothing listens on the port in the guest yet?): %w", waited, vmm.ErrNoGuestListener)
		default:
			return nil, fmt.Errorf("connection closed before OK (%v; the guest refused the port?): %w", err, vmm.ErrNoGuestListener)
		}
	}
	if !strings.HasPrefix(line, "OK ") {
		return nil, fmt.Errorf("unexpected answer to CONNECT: %q", strings.TrimSpace(line))
	}
	if !stop() {
		// ctx ended just as the OK came: the deadline may be set already.
		return nil, fmt.Errorf("waiting for OK: %w", ctx.Err())
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if r.Buffered() == 0 {
		return c, nil
	}
	return &bufferedConn{Conn: c, r: r}, nil
}

// bufferedConn is a connection whose first bytes were read ahead into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) {
	if b.r.Buffered() > 0 {
		return b.r.Read(p)
	}
	return b.Conn.Read(p)
}

// CloseWrite half-closes the connection, as *net.UnixConn does.
func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("close write: not supported")
}
