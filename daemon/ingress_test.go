package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/machine"
)

// TestIngressTLS: with --tls-cert and --tls-key the URLs are served over
// HTTPS with the certificate given, and the URL den prints says https.
func TestIngressTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	pool := writeCert(t, certFile, keyFile)
	in, err := startIngress(Options{HTTPListen: "127.0.0.1:0", HTTPDomain: "den.test", TLSCert: certFile, TLSKey: keyFile, Logger: slog.Default()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer in.close()
	if !strings.HasPrefix(in.url, "https://127.0.0.1:") {
		t.Fatalf("url %q", in.url)
	}
	addr := strings.TrimPrefix(in.url, "https://")
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "den.test"},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
	}}
	// A path that names no VM is answered by the router itself.
	resp, err := hc.Get("https://den.test/nothing-here")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.TLS == nil {
		t.Fatalf("%d %q tls=%v", resp.StatusCode, body, resp.TLS != nil)
	}
	if _, err := startIngress(Options{HTTPListen: "127.0.0.1:0", TLSCert: certFile, Logger: slog.Default()}, nil); err == nil {
		t.Fatal("a certificate without its key was taken")
	}
}

// writeCert writes a self-signed certificate for *.den.test and returns a
// pool that trusts it.
func writeCert(t *testing.T, certFile, keyFile string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "den.test"},
		DNSNames: []string{"den.test", "*.den.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

// TestVMURLForms: the URL den url prints, by path and by host name, with
// the token unless public.
func TestVMURLForms(t *testing.T) {
	priv := machine.URLSettings{Port: 8080, Token: "0123"}
	for _, c := range []struct {
		in   *ingressServer
		u    machine.URLSettings
		want string
	}{
		{&ingressServer{url: "http://127.0.0.1:8081"}, priv, "http://127.0.0.1:8081/vm/box/?den_token=0123"},
		{&ingressServer{url: "http://127.0.0.1:8081"}, machine.URLSettings{Port: 8080, Public: true}, "http://127.0.0.1:8081/vm/box/"},
		{&ingressServer{url: "http://127.0.0.1:8081", domain: "den.test"}, priv, "http://box.den.test:8081/?den_token=0123"},
		{&ingressServer{url: "https://0.0.0.0:443", domain: "den.test", tls: true}, priv, "https://box.den.test/?den_token=0123"},
		{&ingressServer{}, priv, ""},
		{nil, priv, ""},
	} {
		if got := c.in.vmURL("box", c.u); got != c.want {
			t.Errorf("vmURL = %q, want %q", got, c.want)
		}
	}
}
