// Package peer connects the hosts of a den cluster to each other over
// mutual TLS, with host certificates the cluster's CA signs.
package peer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"time"
)

// Credential is a host's identity in the cluster: a certificate for its
// host name, signed at start by the cluster's CA, and the CA that every
// peer's certificate must chain to.
type Credential struct {
	host string
	pool *x509.CertPool
	leaf tls.Certificate
}

// leafLife is how long a host's certificate is valid: it is made again
// at every daemon start.
const leafLife = 30 * 24 * time.Hour

// Load reads the cluster's CA (certFile, and keyFile, which only its
// owner may read) and makes host a certificate signed by it.
func Load(certFile, keyFile, host string) (*Credential, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("cluster ca: %w", err)
	}
	st, err := os.Stat(keyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster ca key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("cluster ca key %s: mode %04o lets others read it: chmod 600 %s", keyFile, st.Mode().Perm(), keyFile)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster ca key: %w", err)
	}
	ca, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("cluster ca %s, %s: %w", certFile, keyFile, err)
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("cluster ca %s: %w", certFile, err)
	}
	if !caCert.IsCA {
		return nil, fmt.Errorf("cluster ca %s: not a CA certificate", certFile)
	}
	signer, ok := ca.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("cluster ca key %s: cannot sign", keyFile)
	}
	leaf, err := sign(caCert, signer, host)
	if err != nil {
		return nil, fmt.Errorf("cluster ca: certificate for host %q: %w", host, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &Credential{host: host, pool: pool, leaf: leaf}, nil
}

// sign makes host's certificate, for serving and for calling peers.
func sign(ca *x509.Certificate, caKey crypto.Signer, host string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key}, nil
}

// Host is the host name the credential's certificate is for.
func (c *Credential) Host() string { return c.host }

// ServerTLS is the TLS config of the host's peer listener: only a peer
// with a certificate of the cluster's CA gets in.
func (c *Credential) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.leaf},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    c.pool,
	}
}

// ClientTLS is the TLS config for calling host: its certificate must be
// the cluster CA's, for that host name.
func (c *Credential) ClientTLS(host string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.leaf},
		RootCAs:      c.pool,
		ServerName:   host,
	}
}

// PeerHost is the host name a verified peer's certificate is for.
func PeerHost(st *tls.ConnectionState) (string, error) {
	if st == nil || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return "", errors.New("no verified peer certificate")
	}
	leaf := st.VerifiedChains[0][0]
	if len(leaf.DNSNames) != 1 {
		return "", fmt.Errorf("peer certificate names %d hosts, want 1", len(leaf.DNSNames))
	}
	return leaf.DNSNames[0], nil
}

// NewCA makes a cluster CA: its certificate and its private key, PEM.
func NewCA(name string, life time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(life),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}
