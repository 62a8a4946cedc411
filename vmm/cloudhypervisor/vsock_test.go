package cloudhypervisor

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// listenSilent accepts connections on a unix socket, reads what comes and
// never answers: Cloud Hypervisor's vsock when nothing in the guest
// listens on the port. It returns what each connection sent, in order.
func listenSilent(t *testing.T, sock string) func() []string {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				line, _ := bufio.NewReader(c).ReadString('\n')
				mu.Lock()
				got = append(got, line)
				mu.Unlock()
				io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// listenGuest is a vsock socket with a guest that listens on port: it
// answers CONNECT with OK and, in the same write, a greeting, then echoes.
func listenGuest(t *testing.T, sock string, port string, greeting string) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		if err != nil || line != "CONNECT "+port+"\n" {
			c.Write([]byte("ERR unexpected " + line))
			return
		}
		c.Write([]byte("OK 1073741824\n" + greeting))
		io.Copy(c, r)
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
}

func TestDialGuestNoListener(t *testing.T) {
	rd := vmm.RunDir(shortDir(t))
	v := New(Options{RunDir: rd, GuestDialTimeout: 300 * time.Millisecond})
	sent := listenSilent(t, rd.VsockSocket())

	start := time.Now()
	c, err := v.DialGuest(testCtx(t, 10*time.Second), 1024)
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("dial succeeded with no listener in the guest")
	}
	if !errors.Is(err, vmm.ErrNoGuestListener) {
		t.Errorf("error %v does not wrap ErrNoGuestListener", err)
	}
	if took < 250*time.Millisecond || took > 2*time.Second {
		t.Errorf("gave up after %s, want about 300ms", took)
	}
	if got := sent(); len(got) != 1 || got[0] != "CONNECT 1024\n" {
		t.Errorf("sent %q", got)
	}

	// A context deadline sooner than GuestDialTimeout wins.
	v = New(Options{RunDir: rd, GuestDialTimeout: 10 * time.Second})
	start = time.Now()
	_, err = v.DialGuest(testCtx(t, 200*time.Millisecond), 1024)
	if !errors.Is(err, vmm.ErrNoGuestListener) || time.Since(start) > 2*time.Second {
		t.Errorf("with a 200ms context: %v after %s", err, time.Since(start))
	}

	// A cancelled context ends the wait as such.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = v.DialGuest(ctx, 1024)
	if !errors.Is(err, context.Canceled) || errors.Is(err, vmm.ErrNoGuestListener) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestDialGuestOK(t *testing.T) {
	rd := vmm.RunDir(shortDir(t))
	v := New(Options{RunDir: rd})
	listenGuest(t, rd.VsockSocket(), "22", "SSH-2.0-den-agent\r\n")

	c, err := v.DialGuest(testCtx(t, 5*time.Second), 22)
	must(t, "dial guest", err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	greeting, err := r.ReadString('\n')
	if err != nil || greeting != "SSH-2.0-den-agent\r\n" {
		t.Fatalf("bytes sent with the OK were lost: %q, %v", greeting, err)
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	echo, err := r.ReadString('\n')
	if err != nil || echo != "ping\n" {
		t.Fatalf("echo %q, %v", echo, err)
	}
	if cw, ok := c.(interface{ CloseWrite() error }); !ok {
		t.Error("connection has no CloseWrite")
	} else if err := cw.CloseWrite(); err != nil {
		t.Error(err)
	}
}

func TestDialGuestRefused(t *testing.T) {
	rd := vmm.RunDir(shortDir(t))
	v := New(Options{RunDir: rd})

	// No vsock socket at all (no VM, or a VM without vsock).
	_, err := v.DialGuest(testCtx(t, 5*time.Second), 22)
	if err == nil || !strings.Contains(err.Error(), "vsock socket") {
		t.Errorf("no socket: %v", err)
	}

	// The VMM closes the connection after CONNECT.
	l, err := net.Listen("unix", rd.VsockSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			bufio.NewReader(c).ReadString('\n')
			c.Close()
		}
	}()
	_, err = v.DialGuest(testCtx(t, 5*time.Second), 22)
	if !errors.Is(err, vmm.ErrNoGuestListener) || !strings.Contains(err.Error(), "closed before OK") {
		t.Errorf("closed after CONNECT: %v", err)
	}
}
