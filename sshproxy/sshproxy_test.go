package sshproxy

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
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
