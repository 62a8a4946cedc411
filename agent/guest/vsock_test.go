//go:build linux

package guest

import (
	"net"
	"os"
	"testing"

	"github.com/denhq/den/agent"
	"golang.org/x/sys/unix"
)

// dialVsockLocal connects to a vsock port of this machine (CID 1, the
// loopback transport) as a net.Conn.
func dialVsockLocal(port uint32) (net.Conn, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_LOCAL, Port: port}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	unix.SetNonblock(fd, true)
	return &fdConn{File: os.NewFile(uintptr(fd), "vsock"), local: VsockAddr{}, remote: VsockAddr{CID: 1, Port: port}}, nil
}

// TestVsockLoopback serves the agent on a real AF_VSOCK listener where the
// kernel has the vsock loopback transport.
func TestVsockLoopback(t *testing.T) {
	if _, err := os.Stat("/sys/module/vsock_loopback"); err != nil {
		t.Skip("no vsock loopback transport (module vsock_loopback)")
	}
	port := uint32(agent.Port + 5000 + os.Getpid()%1000)
	l, err := ListenVsock(port)
	if err != nil {
		t.Skipf("no vsock: %v", err)
	}
	h := newHarness(t)
	go h.srv.Serve(l)
	defer l.Close()
	conn, err := dialVsockLocal(port)
	if err != nil {
		t.Skipf("no vsock loopback transport: %v", err)
	}
	c, err := agent.Dial(testCtx(t), conn, h.clientKey, agent.WithUser(h.user))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	code, out, _ := run(t, c, agent.ExecRequest{CmdLine: "echo over vsock; exit 9"})
	if code != 9 || out != "over vsock\n" {
		t.Fatalf("exec over vsock: %d %q", code, out)
	}
	if l.Addr().Network() != "vsock" {
		t.Errorf("network %q", l.Addr().Network())
	}
}
