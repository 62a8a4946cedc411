package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// inProcess is a listener whose connections are made in this process:
// the SSH gateway's den@ verbs reach the API through it, each connection
// carrying the caller the gateway authenticated, and are served by the
// same handlers as the unix socket's.
type inProcess struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newInProcess() *inProcess {
	return &inProcess{conns: make(chan net.Conn), done: make(chan struct{})}
}

// dial returns the client end of a new connection whose server end
// serves caller. The two ends are a socket pair, not net.Pipe: SSH over
// the upgrade has both ends write their version line before reading,
// which an unbuffered pipe deadlocks.
func (l *inProcess) dial(ctx context.Context, caller Caller) (net.Conn, error) {
	client, server, err := socketPair()
	if err != nil {
		return nil, fmt.Errorf("in-process connection: %w", err)
	}
	select {
	case l.conns <- &connCaller{Conn: server, caller: caller}:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, errors.New("den daemon is stopping")
}

// socketPair is a connected pair of unix stream sockets.
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "den-inproc")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				unix.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}

func (l *inProcess) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *inProcess) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *inProcess) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }
