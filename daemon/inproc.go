package daemon

import (
	"context"
	"errors"
	"net"
	"sync"
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
// serves caller.
func (l *inProcess) dial(ctx context.Context, caller Caller) (net.Conn, error) {
	client, server := net.Pipe()
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
