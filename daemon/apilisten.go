package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/netlimit"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/users"
)

// apiListener is the API's optional TCP listener: TLS, with a bearer
// token per request.
type apiListener struct {
	ln          net.Listener
	addr        string // "" when off
	fingerprint string // SHA-256 of the certificate (hex)
	certFile    string // the certificate clients verify against (--ca)
}

// listenAPI listens on o.APIListen ("" or "off": no listener) with
// o.APITLSCert and o.APITLSKey, or a self-signed certificate the daemon
// makes once and keeps in the state dir, and srv's connection caps
// (nil: none, in tests of other things).
func listenAPI(o Options, state machine.StateDir, srv *netlimit.HTTP) (*apiListener, error) {
	if o.APIListen == "" || o.APIListen == "off" {
		return &apiListener{}, nil
	}
	certFile, keyFile := o.APITLSCert, o.APITLSKey
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("api listener: give both --api-tls-cert and --api-tls-key, or neither (a self-signed certificate)")
	}
	if certFile == "" {
		certFile, keyFile = state.APICert(), state.APIKey()
		if err := selfSigned(certFile, keyFile, o.APIListen); err != nil {
			return nil, fmt.Errorf("api listener: %w", err)
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("api listener: certificate: %w", err)
	}
	ln, err := net.Listen("tcp", o.APIListen)
	if err != nil {
		return nil, fmt.Errorf("api listener: %w (choose another with --api-listen ADDR, or off)", err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	addr := ln.Addr().String()
	if srv != nil {
		ln = srv.Listen(ln, false)
	}
	return &apiListener{ln: tls.NewListener(ln, cfg), addr: addr,
		fingerprint: hex.EncodeToString(sum[:]), certFile: certFile}, nil
}

func (a *apiListener) close() {
	if a.ln != nil {
		_ = a.ln.Close()
	}
}

// selfSigned makes a self-signed certificate for the listener's address,
// localhost and names (DNS names, wildcards too) unless certFile exists
// already.
func selfSigned(certFile, keyFile, listen string, names ...string) error {
	if _, err := os.Stat(certFile); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "den api"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
		DNSNames:    append([]string{"localhost"}, names...),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if ip == nil && host != "" && host != "localhost" {
			tmpl.DNSNames = append(tmpl.DNSNames, host)
		}
	}
	if name, err := os.Hostname(); err == nil && name != "" && name != "localhost" {
		tmpl.DNSNames = append(tmpl.DNSNames, name)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// covers says whether the certificate in certFile is valid for every
// name (a wildcard *.D: for a name under D).
func covers(certFile string, names []string) bool {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return false
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			n = "den-name-check." + rest
		}
		if cert.VerifyHostname(n) != nil {
			return false
		}
	}
	return true
}

// tokenCaller establishes a TLS request's caller from its bearer token.
func tokenCaller(tokens users.Tokens) func(*http.Request) (Caller, error) {
	return func(r *http.Request) (Caller, error) {
		auth := r.Header.Get("Authorization")
		secret, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || secret == "" {
			return Caller{}, fmt.Errorf("who is calling: no bearer token (Authorization: Bearer den_...): %w", api.ErrUnauthenticated)
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		tok, err := tokens.Verify(ctx, secret)
		if err != nil {
			// Wrong, revoked and malformed tokens get the same answer.
			return Caller{}, fmt.Errorf("who is calling: the token is not valid: %w", api.ErrUnauthenticated)
		}
		return Caller{User: tok.User, Admin: tok.Admin, Source: "tls " + r.RemoteAddr + " " + tok.ID, Token: tok.ID}, nil
	}
}
