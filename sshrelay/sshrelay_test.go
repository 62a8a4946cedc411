package sshrelay

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func signer(t *testing.T) ssh.Signer {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// socketPair is a connected pair of unix stream sockets (net.Pipe does
// not buffer, and both SSH ends write their version first).
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// pair runs an SSH server on one end of a pipe and returns the client.
func pair(t *testing.T, serve func(chans <-chan ssh.NewChannel)) *ssh.Client {
	t.Helper()
	a, b := socketPair(t)
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer(t))
	go func() {
		_, chans, reqs, err := ssh.NewServerConn(a, cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		serve(chans)
	}()
	c, chans, reqs, err := ssh.NewClientConn(b, "pipe", &ssh.ClientConfig{User: "x", HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	client := ssh.NewClient(c, chans, reqs)
	t.Cleanup(func() { client.Close() })
	return client
}

// fakeAgent answers "exec" requests: it echoes stdin upper-cased to
// stdout, writes the command to stderr and exits with status 3.
func fakeAgent(chans <-chan ssh.NewChannel) {
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, reqs, _ := nc.Accept()
		go func() {
			for req := range reqs {
				if req.Type != "exec" {
					req.Reply(false, nil)
					continue
				}
				req.Reply(true, nil)
				cmd := string(req.Payload[4:])
				go func() {
					ch.Stderr().Write([]byte("ran " + cmd))
					buf := new(bytes.Buffer)
					buf.ReadFrom(ch)
					ch.Write(bytes.ToUpper(buf.Bytes()))
					status := make([]byte, 4)
					binary.BigEndian.PutUint32(status, 3)
					ch.SendRequest("exit-status", false, status)
					ch.Close()
				}()
			}
		}()
	}
}

func TestRelayExecWithStdinAndExitStatus(t *testing.T) {
	upstream := pair(t, fakeAgent)
	var began, ended int
	done := make(chan struct{})
	client := pair(t, func(chans <-chan ssh.NewChannel) {
		Serve(context.Background(), chans, upstream, Hooks{
			Begin: func(string) { began++ },
			End:   func(string) { ended++; close(done) },
		})
	})
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr = &stdout, &stderr
	sess.Stdin = strings.NewReader("hello")
	err = sess.Run("make test")
	var exit *ssh.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 3 {
		t.Fatalf("run: %v, want exit status 3", err)
	}
	if stdout.String() != "HELLO" || stderr.String() != "ran make test" {
		t.Fatalf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("channel end not reported")
	}
	if began != 1 || ended != 1 {
		t.Fatalf("hooks: began %d ended %d", began, ended)
	}
}

func TestRelayRejections(t *testing.T) {
	upstream := pair(t, fakeAgent)
	client := pair(t, func(chans <-chan ssh.NewChannel) {
		Serve(context.Background(), chans, upstream, Hooks{Allow: func(typ string, _ []byte) error {
			if typ == "direct-tcpip" {
				return errors.New("port forwarding is off")
			}
			return nil
		}})
	})
	if _, err := client.Dial("tcp", "127.0.0.1:80"); err == nil || !strings.Contains(err.Error(), "port forwarding is off") {
		t.Fatalf("forward: %v", err)
	}
	// The upstream's own rejection reaches the client unchanged.
	if _, _, err := client.OpenChannel("x11", nil); err == nil || !strings.Contains(err.Error(), "only sessions") {
		t.Fatalf("x11: %v", err)
	}
}

// instantAgent answers "exec" and at once sends exit status 7 and closes
// the channel: a command that ends before its client has heard that it
// started.
func instantAgent(chans <-chan ssh.NewChannel) {
	for nc := range chans {
		ch, reqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go func() {
			for req := range reqs {
				req.Reply(req.Type == "exec", nil)
				if req.Type == "exec" {
					status := make([]byte, 4)
					binary.BigEndian.PutUint32(status, 7)
					ch.SendRequest("exit-status", false, status)
					ch.Close()
				}
			}
		}()
	}
}

// TestRelayInstantExit: the client always gets the exec reply and the
// exit status of a command that ends at once, never a bare EOF (the
// relay used to close the client's channel before passing the reply on).
func TestRelayInstantExit(t *testing.T) {
	upstream := pair(t, instantAgent)
	client := pair(t, func(chans <-chan ssh.NewChannel) {
		Serve(context.Background(), chans, upstream, Hooks{})
	})
	for i := 0; i < 300; i++ {
		sess, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		err = sess.Run("exit 7")
		var exit *ssh.ExitError
		if !errors.As(err, &exit) || exit.ExitStatus() != 7 {
			t.Fatalf("run %d: %v, want exit status 7", i, err)
		}
	}
}

// gate is one session's: closed when the relay holds back the upstream's
// EOF for the exit status (see testHookEOFHeld).
type gate struct {
	once sync.Once
	held chan struct{}
}

// gatedAgent answers "exec" the way den's guest agent ends a command
// (output, EOF, then the exit status, then close), except that it holds
// the exit status until either the relay holds back the EOF (the fixed
// relay) or the client has closed the channel (what OpenSSH does once it
// has sent its EOF and got ours): with a relay that passes the EOF on at
// once, the client always closes first, and its exit status is lost.
func gatedAgent(g *atomic.Pointer[gate], signal bool) func(chans <-chan ssh.NewChannel) {
	return func(chans <-chan ssh.NewChannel) {
		for nc := range chans {
			ch, reqs, err := nc.Accept()
			if err != nil {
				continue
			}
			cur := g.Load()
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				for req := range reqs {
					req.Reply(req.Type == "exec", nil)
					if req.Type != "exec" {
						continue
					}
					go func() {
						ch.Write([]byte("ok\n"))
						ch.CloseWrite()
						select {
						case <-cur.held:
						case <-closed:
						}
						if signal {
							ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
								Signal     string
								CoreDumped bool
								Error      string
								Lang       string
							}{Signal: "KILL"}))
						} else {
							ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{7}))
						}
						ch.Close()
					}()
				}
			}()
		}
	}
}

// opensshLike runs "exit 7" on a new channel the way OpenSSH does, in the
// given order of its EOF and its exec request, and closes the channel
// as soon as it has both sent and received EOF (OpenSSH's rule). It
// returns the exit-status or exit-signal request received, if any.
func opensshLike(t *testing.T, c *ssh.Client, order string) (string, []byte) {
	t.Helper()
	ch, reqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		typ     string
		payload []byte
	}
	reqsDone := make(chan struct{})
	go func() {
		defer close(reqsDone)
		for r := range reqs {
			if r.Type == "exit-status" || r.Type == "exit-signal" {
				got.typ, got.payload = r.Type, r.Payload
			}
			if r.WantReply {
				r.Reply(false, nil)
			}
		}
	}()
	exec := ssh.Marshal(struct{ Command string }{"exit 7"})
	switch order {
	case "eof-before-exec":
		ch.CloseWrite()
		if ok, err := ch.SendRequest("exec", true, exec); !ok || err != nil {
			t.Fatalf("exec: %v %v", ok, err)
		}
	case "eof-right-after-exec": // OpenSSH: exec wants a reply, EOF does not wait for it
		ch.SendRequest("exec", false, exec)
		ch.CloseWrite()
	case "eof-after-exec-reply":
		if ok, err := ch.SendRequest("exec", true, exec); !ok || err != nil {
			t.Fatalf("exec: %v %v", ok, err)
		}
		ch.CloseWrite()
	default:
		t.Fatalf("order %q", order)
	}
	out, err := io.ReadAll(ch)
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("stdout %q: %v", out, err)
	}
	ch.Close() // both EOFs: OpenSSH closes now
	select {
	case <-reqsDone:
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed")
	}
	return got.typ, got.payload
}

// TestRelayClientEOFBeforeExit: whatever the order of the client's EOF
// and its exec request, a client that closes the channel as soon as it
// has both sent and received EOF gets the exit status (or signal) first.
// The relay used to pass the upstream's EOF on before the exit status
// that followed it; x/crypto/ssh answers the client's close at once, and
// the exit status was then lost (OpenSSH with ControlMaster and stdin at
// EOF exited 255 for `exit 7`).
func TestRelayClientEOFBeforeExit(t *testing.T) {
	var g atomic.Pointer[gate]
	g.Store(&gate{held: make(chan struct{})})
	testHookEOFHeld = func() {
		cur := g.Load()
		cur.once.Do(func() { close(cur.held) })
	}
	t.Cleanup(func() { testHookEOFHeld = nil })
	for _, signal := range []bool{false, true} {
		upstream := pair(t, gatedAgent(&g, signal))
		client := pair(t, func(chans <-chan ssh.NewChannel) {
			Serve(context.Background(), chans, upstream, Hooks{})
		})
		for _, order := range []string{"eof-before-exec", "eof-right-after-exec", "eof-after-exec-reply"} {
			for i := 0; i < 20; i++ {
				g.Store(&gate{held: make(chan struct{})})
				typ, payload := opensshLike(t, client, order)
				switch {
				case signal && typ == "exit-signal" && strings.HasPrefix(string(payload[4:]), "KILL"):
				case !signal && typ == "exit-status" && binary.BigEndian.Uint32(payload) == 7:
				default:
					t.Fatalf("signal %v, %s, run %d: got %q %q, want the exit status", signal, order, i, typ, payload)
				}
			}
		}
	}
}

// TestRelayForwardHalfClose: a forward's EOF is passed on at once (it has
// no exit status to wait for), so half-closing protocols still work.
func TestRelayForwardHalfClose(t *testing.T) {
	upstream := pair(t, func(chans <-chan ssh.NewChannel) {
		for nc := range chans {
			ch, reqs, err := nc.Accept()
			if err != nil {
				continue
			}
			go ssh.DiscardRequests(reqs)
			go func() { // says hello, half-closes, then echoes what it reads
				ch.Write([]byte("hello"))
				ch.CloseWrite()
				b, _ := io.ReadAll(ch)
				_ = b
				ch.Close()
			}()
		}
	})
	client := pair(t, func(chans <-chan ssh.NewChannel) {
		Serve(context.Background(), chans, upstream, Hooks{})
	})
	ch, reqs, err := client.OpenChannel("direct-tcpip", ssh.Marshal(struct {
		Host  string
		Port  uint32
		OHost string
		OPort uint32
	}{"127.0.0.1", 80, "127.0.0.1", 1}))
	if err != nil {
		t.Fatal(err)
	}
	go ssh.DiscardRequests(reqs)
	defer ch.Close()
	out, err := io.ReadAll(ch) // EOF while the client's side is open
	if err != nil || string(out) != "hello" {
		t.Fatalf("forward: %q %v", out, err)
	}
}
