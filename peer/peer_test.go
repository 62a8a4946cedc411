package peer

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ca writes a cluster CA into dir and returns its files.
func ca(t *testing.T, dir, name string) (cert, key string) {
	t.Helper()
	c, k, err := NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(cert, c, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// handshake runs a TLS handshake between server and client configs over
// loopback and returns the host the server saw, or the first error.
func handshake(t *testing.T, server, client *tls.Config) (string, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		host string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(30 * time.Second))
		if err := tc.Handshake(); err != nil {
			got <- result{err: err}
			return
		}
		st := tc.ConnectionState()
		h, err := PeerHost(&st)
		got <- result{h, err}
	}()
	d := &tls.Dialer{Config: client}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err == nil {
		// TLS 1.3: the server's verdict on the client's certificate
		// arrives with the first read.
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Read(make([]byte, 1))
		c.Close()
	}
	r := <-got
	if err != nil {
		return "", err
	}
	return r.host, r.err
}

// TestMutualTLS: two hosts of one CA reach each other and each learns
// the other's name; a host of another CA, or a server that is not the
// host the client asked for, is refused.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := ca(t, dir, "cluster")
	a, err := Load(cert, key, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(cert, key, "host-b")
	if err != nil {
		t.Fatal(err)
	}
	if h, err := handshake(t, a.ServerTLS(), b.ClientTLS("host-a")); err != nil || h != "host-b" {
		t.Fatalf("host-b to host-a: %q, %v", h, err)
	}
	if _, err := handshake(t, a.ServerTLS(), b.ClientTLS("host-c")); err == nil {
		t.Fatal("host-a's certificate was taken for host-c")
	}
	ocert, okey := ca(t, dir, "other")
	x, err := Load(ocert, okey, "host-x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, a.ServerTLS(), x.ClientTLS("host-a")); err == nil {
		t.Fatal("a host of another CA got in")
	}
	if _, err := handshake(t, x.ServerTLS(), a.ClientTLS("host-x")); err == nil {
		t.Fatal("a server of another CA was trusted")
	}
}

// TestLoadRefused: a CA key others may read, or a missing certificate,
// is refused in one line.
func TestLoadRefused(t *testing.T) {
	dir := t.TempDir()
	cert, key := ca(t, dir, "cluster")
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(cert, key, "h"); err == nil || !strings.Contains(err.Error(), "lets others read it") {
		t.Fatalf("loose key: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "none.crt"), key, "h"); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("missing certificate: %v", err)
	}
}
