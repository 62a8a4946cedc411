package netlimit

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/testutil"
)

func TestSourceOf(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.7:22":                "192.0.2.7",
		"[::ffff:192.0.2.7]:22":       "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:22":   "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:2222": "2001:db8:1:2::/64",
		"[fe80::1%eth0]:22":           "fe80::/64",
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := SourceOf(a); got != want {
			t.Errorf("SourceOf(%s) = %s, want %s", addr, got, want)
		}
	}
}

// fakeConn is a connection from a given address.
type fakeConn struct {
	net.Conn
	remote string
}

func (c fakeConn) RemoteAddr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", c.remote)
	return a
}

// TestConns: a source over its cap is refused; at the cap in all, the
// oldest connection of the source holding the most makes room, never a
// newcomer's from an address of its own.
func TestConns(t *testing.T) {
	c := NewConns(4, 2)
	admit := func(remote string) (*Conn, *Conn, error) { return c.Admit(fakeConn{remote: remote}) }
	a1, _, _ := admit("192.0.2.1:1")
	a2, _, _ := admit("192.0.2.1:2")
	if _, _, err := admit("192.0.2.1:3"); !errors.Is(err, ErrSourceFull) {
		t.Fatalf("a third from one source: %v", err)
	}
	b1, _, _ := admit("192.0.2.2:1")
	if _, v, err := admit("192.0.2.3:1"); err != nil || v != nil {
		t.Fatalf("the fourth: victim %v, %v", v, err)
	}
	// Full: the newcomer evicts the oldest of 192.0.2.1, which holds two.
	if _, v, err := admit("192.0.2.4:1"); err != nil || v != a1 {
		t.Fatalf("at the cap: victim %v, want %v (%v)", v, a1, err)
	}
	if all, from := c.Count("192.0.2.1"); all != 4 || from != 1 {
		t.Fatalf("counts %d %d", all, from)
	}
	c.Release(a1) // already evicted: no effect
	c.Release(a2)
	c.Release(a2)
	c.Release(b1)
	if all, _ := c.Count(""); all != 2 {
		t.Fatalf("after releases: %d counted, want 2", all)
	}
}

// serve runs a limited server for h on 127.0.0.1, plain or TLS, and
// returns its address and log.
func serve(t *testing.T, h http.Handler, l HTTPLimits, tlsCfg *tls.Config) (*HTTP, string, *testutil.Buffer) {
	t.Helper()
	logs := &testutil.Buffer{}
	s := NewHTTP("test listener", h, l, slog.New(slog.NewTextHandler(logs, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limited := s.Listen(ln, tlsCfg == nil)
	if tlsCfg != nil {
		limited = tls.NewListener(limited, tlsCfg)
	}
	go func() { _ = s.Server.Serve(limited) }()
	t.Cleanup(func() { _ = s.Server.Close(); s.Close() })
	return s, ln.Addr().String(), logs
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one request on c and returns the status line.
func get(c net.Conn, extra string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n%s\r\n", extra); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })

// limits are the test's: small caps, defaults otherwise.
func limits(max, perSource int) HTTPLimits {
	l := Ingress
	l.MaxConns, l.MaxConnsPerSource = max, perSource
	return l
}

// TestHTTPHeaderLimit: a header over MaxHeaderBytes, or with more than
// MaxHeaderFields fields, is answered 431.
func TestHTTPHeaderLimit(t *testing.T) {
	_, addr, _ := serve(t, ok, limits(16, 16), nil)
	c := dialFrom(t, "127.0.0.1", addr)
	go func() { // the server answers before it has read it all
		_, _ = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n", strings.Repeat("a", 1<<20))
	}()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	status, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(status, " 431 ") {
		t.Fatalf("1 MiB header: %q %v", status, err)
	}
	if status, err := get(dialFrom(t, "127.0.0.1", addr), "X-Pad: "+strings.Repeat("a", 32<<10)+"\r\n"); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("32 KiB header: %q %v", status, err)
	}
	// 10,000 small fields fit in the bytes, not in the count.
	if status, err := get(dialFrom(t, "127.0.0.1", addr), strings.Repeat("a:b\r\n", 10000)); err != nil || !strings.Contains(status, " 431 ") {
		t.Fatalf("10,000 header fields: %q %v", status, err)
	}
	if status, err := get(dialFrom(t, "127.0.0.1", addr), strings.Repeat("a:b\r\n", 200)); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("200 header fields: %q %v", status, err)
	}
}

// TestHTTPConnCaps: a source over its cap is answered 503 and closed;
// other sources are served; over the cap in all, the source holding the
// most loses its oldest connection.
func TestHTTPConnCaps(t *testing.T) {
	s, addr, logs := serve(t, ok, limits(4, 2), nil)
	a1, a2 := dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)
	for _, c := range []net.Conn{a1, a2} { // served, and kept alive
		if status, err := get(c, ""); err != nil || !strings.Contains(status, " 200 ") {
			t.Fatalf("127.0.0.2: %q %v", status, err)
		}
	}
	refused := dialFrom(t, "127.0.0.2", addr)
	_ = refused.SetReadDeadline(time.Now().Add(30 * time.Second))
	if b, _ := io.ReadAll(refused); !strings.Contains(string(b), " 503 ") || !strings.Contains(string(b), "too many connections from this address") {
		t.Fatalf("a third from 127.0.0.2: %q", b)
	}
	if status, err := get(dialFrom(t, "127.0.0.3", addr), ""); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("127.0.0.3 while 127.0.0.2 is full: %q %v", status, err)
	}
	if !poll.Until(10*time.Second, func() bool { all, _ := s.Count(""); return all == 3 }) {
		t.Fatal("the connections are not counted")
	}
	dialFrom(t, "127.0.0.4", addr) // the fourth: the cap
	if status, err := get(dialFrom(t, "127.0.0.5", addr), ""); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("a newcomer at the cap: %q %v", status, err)
	}
	// a1, the oldest of the address holding the most, was closed.
	_ = a1.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := a1.Read(make([]byte, 1)); err == nil {
		t.Fatal("the oldest connection of 127.0.0.2 still open")
	}
	if status, err := get(a2, ""); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("127.0.0.2's second connection: %q %v", status, err)
	}
	if !poll.Until(10*time.Second, func() bool {
		l := logs.String()
		return strings.Contains(l, "refusing a connection") && strings.Contains(l, "closing the oldest")
	}) {
		t.Fatalf("log: %s", logs.String())
	}
}

// TestHTTPStalls: a body read and an answer's write each have their own
// deadline; neither the request as a whole, nor a handler that waits
// between writes, nor the wait after the body was read, is cut.
func TestHTTPStalls(t *testing.T) {
	const stall = 2 * time.Second
	l := limits(64, 64)
	l.ReadTimeout, l.WriteTimeout = stall, stall
	results := make(chan string, 8)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			n, err := io.Copy(io.Discard, r.Body)
			results <- fmt.Sprintf("upload %d %v", n, err)
		case "/wait": // waits past the stall before writing, with a body read
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
				results <- "wait: context ended"
				return
			case <-time.After(stall + stall/2):
			}
			_, _ = io.WriteString(w, "first\n")
			http.NewResponseController(w).Flush()
			time.Sleep(stall + stall/2)
			_, err := io.WriteString(w, "second\n")
			results <- fmt.Sprintf("wait %v", err)
		case "/early": // answers without reading the body, as a 401 does
			w.WriteHeader(http.StatusUnauthorized)
		case "/hijack": // reads its body, then owns the connection
			_, _ = io.Copy(io.Discard, r.Body)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				results <- "hijack " + err.Error()
				return
			}
			defer c.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			l, err := brw.ReadString('\n')
			_, _ = io.WriteString(c, l)
			results <- fmt.Sprintf("hijack %v", err)
		case "/big": // the client never reads
			var err error
			for i := 0; i < 1024 && err == nil; i++ {
				_, err = w.Write(make([]byte, 64<<10))
			}
			results <- fmt.Sprintf("big %v", err)
		}
	})
	_, addr, _ := serve(t, h, l, nil)
	hc := &http.Client{Timeout: time.Minute}

	t.Run("moving upload", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() { // 3 stalls long in all, a write every 10 ms
			end := time.Now().Add(3 * stall)
			for time.Now().Before(end) {
				if _, err := pw.Write(make([]byte, 1024)); err != nil {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			pw.Close()
		}()
		resp, err := hc.Post("http://"+addr+"/upload", "application/octet-stream", pr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if r := <-results; !strings.HasSuffix(r, " <nil>") {
			t.Fatalf("a moving upload: %s", r)
		}
	})
	t.Run("stalled upload", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n%s", make([]byte, 1000))
		if r := <-results; !strings.Contains(r, "timeout") {
			t.Fatalf("a stalled upload: %s", r)
		}
	})
	t.Run("waits", func(t *testing.T) {
		resp, err := hc.Post("http://"+addr+"/wait", "text/plain", strings.NewReader("body"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if r := <-results; r != "wait <nil>" || string(b) != "first\nsecond\n" || err != nil {
			t.Fatalf("a handler that waits: %s, %q %v", r, b, err)
		}
	})
	t.Run("body left unread", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(c, "POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n%s", make([]byte, 1000))
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c) // the answer, then the end: not a wait for the rest forever
		if !strings.Contains(string(b), " 401 ") || err != nil {
			t.Fatalf("a body left unread: %q %v", b, err)
		}
	})
	t.Run("hijacked", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(c, "POST /hijack HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\nx")
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if l == "\r\n" {
				break
			}
		}
		time.Sleep(stall + stall/2) // past both deadlines: the connection is not theirs
		fmt.Fprint(c, "ping\n")
		if l, err := br.ReadString('\n'); l != "ping\n" || err != nil {
			t.Fatalf("a hijacked connection after the deadlines: %q %v", l, err)
		}
		if r := <-results; r != "hijack <nil>" {
			t.Fatal(r)
		}
	})
	t.Run("stalled download", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		if r := <-results; !strings.Contains(r, "timeout") {
			t.Fatalf("a client that does not read: %s", r)
		}
	})
}

// TestTLSHandshakeLogs: a flood of failed TLS handshakes logs a bounded
// number of lines, and a summary of the rest.
func TestTLSHandshakeLogs(t *testing.T) {
	l := limits(64, 64)
	l.LogSummary = 200 * time.Millisecond
	_, addr, logs := serve(t, ok, l, selfSigned(t))
	const n = 2000
	start := time.Now()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "GET / HTTP/1.0\r\n\r\n") // not a handshake
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	elapsed := time.Since(start)
	count := func() (lines, logged, summed int) {
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if line == "" {
				continue
			}
			lines++
			if strings.Contains(line, "tls handshake failed") && !strings.Contains(line, "suppressed") {
				logged++
			}
			if i := strings.Index(line, " count="); i >= 0 {
				var c int
				fmt.Sscanf(line[i+1:], "count=%d", &c)
				summed += c
			}
		}
		return
	}
	if !poll.Until(10*time.Second, func() bool { _, logged, summed := count(); return logged+summed == n }) {
		_, logged, summed := count()
		t.Fatalf("%d logged and %d summed up of %d failed handshakes:\n%.2000s", logged, summed, n, logs.String())
	}
	lines, logged, _ := count()
	maxLogged := l.LogBurst + int(elapsed/l.LogEvery) + 1
	if maxLines := maxLogged + int(elapsed/l.LogSummary) + 2; logged > maxLogged || lines > maxLines {
		t.Fatalf("%d failed handshakes in %s: %d lines (%d logged), want at most %d", n, elapsed, lines, logged, maxLines)
	}
	t.Logf("%d failed handshakes in %s: %d log lines", n, elapsed.Round(time.Millisecond), lines)
}

// selfSigned is a TLS config with a fresh certificate for 127.0.0.1.
func selfSigned(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
}
