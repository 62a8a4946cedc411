package sshgw

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// syncBuffer is a log sink for a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLongUserNameRefused(t *testing.T) {
	logs := &syncBuffer{}
	f := newFixture(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	long := "box" + strings.Repeat("x", 64<<10)
	var banner string
	_, err := gossh.Dial("tcp", f.srv.Addr().String(), &gossh.ClientConfig{
		User: long, Auth: []gossh.AuthMethod{gossh.PublicKeys(f.alice)},
		HostKeyCallback: gossh.FixedHostKey(f.hostKey.PublicKey()), Timeout: 10 * time.Second,
		BannerCallback: func(m string) error { banner = m; return nil },
	})
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("64 KiB user name: %v", err)
	}
	if !strings.Contains(banner, "user name is too long (65539 bytes; the limit is 256)") || len(banner) > 200 {
		t.Fatalf("banner %q", banner)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "user name too long") })
	if l := logs.String(); strings.Contains(l, strings.Repeat("x", 100)) || !strings.Contains(l, `(65539 bytes)`) {
		t.Fatalf("log: %.300q", l)
	}
	if f.b.opens.Load() != 0 {
		t.Fatal("a VM was claimed")
	}
	// At the limit is fine (it is not a VM, so refused after login).
	c, err := f.dial(strings.Repeat("b", MaxUserName), f.alice)
	if err != nil {
		t.Fatalf("user name of %d bytes: %v", MaxUserName, err)
	}
	c.Close()
}

func TestChannelCap(t *testing.T) {
	const max = 4
	f := newFixture(t, func(c *Config) { c.MaxChannels = max })
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var open []gossh.Channel
	for i := 0; i < max; i++ {
		ch, reqs, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("channel %d: %v", i, err)
		}
		go gossh.DiscardRequests(reqs)
		open = append(open, ch)
	}
	// 1,000 more at once are refused, and say why.
	for i := 0; i < 1000; i++ {
		_, _, err := c.OpenChannel("session", nil)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, "too many channels open on this connection (the limit is 4)") {
			t.Fatalf("channel over the cap: %v", err)
		}
	}
	// Closing one makes room.
	open[0].Close()
	waitFor(t, func() bool {
		s, err := c.NewSession()
		if err != nil {
			return false
		}
		defer s.Close()
		err = s.Run("exit 3")
		var ee *gossh.ExitError
		return errors.As(err, &ee) && ee.ExitStatus() == 3
	})
	for _, ch := range open[1:] {
		ch.Close()
	}
	// Another connection has its own count.
	c2, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, _, code := run(t, c2, "exit 5"); code != 5 {
		t.Fatalf("second connection: %d", code)
	}
}

func TestUnauthenticatedPerSource(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.MaxUnauthenticated = 10
		c.MaxUnauthenticatedPerSource = 2
	})
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", f.srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	admitted := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line := make([]byte, 8)
		_, err := io.ReadFull(c, line)
		return err == nil && string(line) == "SSH-2.0-"
	}
	a1, a2 := dial("127.0.0.1"), dial("127.0.0.1")
	if !admitted(a1) || !admitted(a2) {
		t.Fatal("connections under the per-source cap refused")
	}
	if admitted(dial("127.0.0.1")) {
		t.Fatal("a third unauthenticated connection from one address admitted")
	}
	// Another address has slots of its own.
	if !admitted(dial("127.0.0.2")) {
		t.Fatal("another address refused")
	}
	// A slot is freed when its connection ends.
	a1.Close()
	waitFor(t, func() bool { return admitted(dial("127.0.0.1")) })
	// An authenticated connection holds no slot.
	for i := 0; i < 3; i++ {
		conn, chans, reqs, err := gossh.NewClientConn(dial("127.0.0.3"), f.srv.Addr().String(), &gossh.ClientConfig{
			User: "box", Auth: []gossh.AuthMethod{gossh.PublicKeys(f.alice)},
			HostKeyCallback: gossh.FixedHostKey(f.hostKey.PublicKey()), Timeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatalf("authenticated connection %d: %v", i, err)
		}
		c := gossh.NewClient(conn, chans, reqs)
		defer c.Close()
		if _, _, code := run(t, c, "exit 4"); code != 4 {
			t.Fatalf("authenticated connection %d: exit %d", i, code)
		}
	}
}
