package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestParseForward(t *testing.T) {
	for _, tc := range []struct {
		in            string
		local, remote int // 0: an error
	}{
		{"3000", 3000, 3000},
		{"8080:80", 8080, 80},
		{"1", 1, 1},
		{"65535:65535", 65535, 65535},
		{"0080", 80, 80},
		{"0", 0, 0},
		{"65536", 0, 0},
		{"99999", 0, 0},
		{"123456", 0, 0},
		{"8080:0", 0, 0},
		{"0:80", 0, 0},
		{"", 0, 0},
		{":80", 0, 0},
		{"80:", 0, 0},
		{"1:2:3", 0, 0},
		{"+80", 0, 0},
		{"-1", 0, 0},
		{" 80", 0, 0},
		{"http", 0, 0},
		{"localhost:80", 0, 0},
		{"0x50", 0, 0},
	} {
		f, err := parseForward(tc.in)
		switch {
		case tc.local == 0 && err == nil:
			t.Errorf("%q: got %+v, want an error", tc.in, f)
		case tc.local == 0 && !strings.Contains(err.Error(), "use PORT or LOCAL:PORT, each a number from 1 to 65535"):
			t.Errorf("%q: error %q", tc.in, err)
		case tc.local != 0 && (err != nil || f != portForward{tc.local, tc.remote}):
			t.Errorf("%q: got %+v, %v; want %d:%d", tc.in, f, err, tc.local, tc.remote)
		}
	}
	if _, err := parseForwards([]string{"3000", "3001:3000", "3000:22"}); err == nil || err.Error() != "local port 3000 is given twice" {
		t.Errorf("twice: %v", err)
	}
	got, err := parseForwards([]string{"3000", "3001:3000"})
	if err != nil || len(got) != 2 || got[1] != (portForward{3001, 3000}) {
		t.Errorf("got %+v, %v", got, err)
	}
}

func TestForwardUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"forward"}, "den forward: missing VM name (see den forward --help)"},
		{[]string{"forward", "box"}, "den forward: missing PORT: den forward NAME [LOCAL:]PORT... (see den forward --help)"},
		{[]string{"forward", "../x", "80"}, `den forward: bad vm name "../x"`},
		{[]string{"forward", "box", "80", "x:81"}, `den forward: bad port "x:81": use PORT or LOCAL:PORT, each a number from 1 to 65535 (see den forward --help)`},
		{[]string{"forward", "box", "70000"}, `den forward: bad port "70000"`},
		{[]string{"forward", "box", "80", "80"}, "den forward: local port 80 is given twice"},
		{[]string{"forward", "box", "80", "--listen", "127.0.0.1:80"}, `den forward: --listen "127.0.0.1:80": give a host or IP address, without a port`},
		{[]string{"forward", "box", "80", "--listen="}, `den forward: --listen "": give a host`},
		{[]string{"forward", "box", "80", "--lisen", "x"}, "den forward: unknown flag --lisen"},
	} {
		stderr, code := runDen(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("den %q: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
	// Good arguments get as far as the (missing) daemon, after listening.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	if stderr, code := runDen(t, "forward", "box", port+":80", "--listen", "127.0.0.1"); code != 1 || !strings.Contains(stderr, "daemon") {
		t.Errorf("exit %d, %q; want 1 and the daemon's absence", code, stderr)
	}
}

// fakeVM is an SSH server whose direct-tcpip channels reach ports on
// 127.0.0.1 of this host: a stand-in for the daemon and the guest.
func fakeVM(t *testing.T, ports map[uint32]string) *ssh.Client {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	// Not net.Pipe: both ends write their version at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, chans, reqs, err := ssh.NewServerConn(b, cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		for nc := range chans {
			var d struct {
				Host     string
				Port     uint32
				OrigHost string
				OrigPort uint32
			}
			if nc.ChannelType() != "direct-tcpip" || ssh.Unmarshal(nc.ExtraData(), &d) != nil || d.Host != "127.0.0.1" {
				_ = nc.Reject(ssh.Prohibited, "no")
				continue
			}
			conn, err := net.Dial("tcp", ports[d.Port])
			if err != nil {
				_ = nc.Reject(ssh.ConnectionFailed, err.Error())
				continue
			}
			ch, creqs, err := nc.Accept()
			if err != nil {
				conn.Close()
				continue
			}
			go ssh.DiscardRequests(creqs)
			go func() {
				_, _ = io.Copy(ch, conn)
				_ = ch.CloseWrite()
			}()
			go func() {
				_, _ = io.Copy(conn, ch)
				_ = conn.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	sc, chans, reqs, err := ssh.NewClientConn(a, "vm", &ssh.ClientConfig{User: "box", HostKeyCallback: ssh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	client := ssh.NewClient(sc, chans, reqs)
	t.Cleanup(func() { client.Close() })
	return client
}

// lockedBuffer is a stderr the forwarder's goroutines may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestForwarder: connections to the local port reach the VM's port,
// half-closes included; a port nothing listens on is said so.
func TestForwarder(t *testing.T) {
	// The guest's service: reads everything, then answers and closes.
	svc, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	go func() {
		for {
			c, err := svc.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				in, _ := io.ReadAll(c)
				_, _ = c.Write(append([]byte("got "), in...))
			}()
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	client := fakeVM(t, map[uint32]string{3000: svc.Addr().String(), 4000: refusedAddr})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr lockedBuffer
	serve := func(remote int) net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		fw := &forwarder{ctx: ctx, client: client, vm: "box", ln: ln, remote: remote, stderr: &stderr}
		go fw.serve()
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	ln := serve(3000)
	for i := range 3 { // one channel per connection
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := "hello " + strconv.Itoa(i)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).CloseWrite() // the service answers at EOF
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "got "+msg {
			t.Errorf("got %q, %v; want %q", got, err, "got "+msg)
		}
		c.Close()
	}

	ln = serve(4000)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.ReadAll(c); err != nil || len(got) != 0 {
		t.Errorf("refused port: got %q, %v; want the connection closed", got, err)
	}
	c.Close()
	if want := "-> box:4000: nothing listens on port 4000 in box\n"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}
