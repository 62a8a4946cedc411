//go:build linux

package guest

import (
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenVsock listens on an AF_VSOCK stream port for any CID. It fails
// (EAFNOSUPPORT) in a guest without a vsock transport.
func ListenVsock(port uint32) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock bind port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen port %d: %w", port, err)
	}
	return NewFDListener(fd, VsockAddr{CID: unix.VMADDR_CID_ANY, Port: port})
}

// VsockAddr is a vsock address.
type VsockAddr struct {
	CID  uint32
	Port uint32
}

// Network implements net.Addr.
func (VsockAddr) Network() string { return "vsock" }

func (a VsockAddr) String() string { return fmt.Sprintf("vsock:%d:%d", a.CID, a.Port) }

// NewFDListener wraps a listening, non-blocking stream socket of any
// family (vsock, which package net does not know) as a net.Listener on
// Go's poller. It owns fd.
func NewFDListener(fd int, addr net.Addr) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), addr.String())
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("listener %s: %w", addr, err)
	}
	return &fdListener{f: f, rc: rc, addr: addr}, nil
}

type fdListener struct {
	f    *os.File
	rc   syscall.RawConn
	addr net.Addr
}

func (l *fdListener) Accept() (net.Conn, error) {
	var nfd int
	var sa unix.Sockaddr
	var aerr error
	err := l.rc.Read(func(fd uintptr) bool {
		nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return aerr != unix.EAGAIN
	})
	if err != nil {
		return nil, fmt.Errorf("accept %s: %w", l.addr, net.ErrClosed)
	}
	if aerr != nil {
		return nil, fmt.Errorf("accept %s: %w", l.addr, aerr)
	}
	f := os.NewFile(uintptr(nfd), "conn")
	return &fdConn{File: f, local: l.addr, remote: sockaddrAddr(sa)}, nil
}

func (l *fdListener) Close() error   { return l.f.Close() }
func (l *fdListener) Addr() net.Addr { return l.addr }

func sockaddrAddr(sa unix.Sockaddr) net.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrVM:
		return VsockAddr{CID: a.CID, Port: a.Port}
	case *unix.SockaddrUnix:
		return &net.UnixAddr{Name: a.Name, Net: "unix"}
	}
	return VsockAddr{}
}

// fdConn is an accepted socket; *os.File gives it reads, writes and
// deadlines on Go's poller.
type fdConn struct {
	*os.File
	local, remote net.Addr
}

func (c *fdConn) LocalAddr() net.Addr  { return c.local }
func (c *fdConn) RemoteAddr() net.Addr { return c.remote }

// CloseWrite shuts down the sending side.
func (c *fdConn) CloseWrite() error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return serr
}
