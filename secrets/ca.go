package secrets

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"filippo.io/age"

	"github.com/denhq/den/internal/atomicfile"
)

// CA is one VM's certificate authority: the guest trusts it, and den
// signs with it the certificates of the hosts whose HTTPS it takes over
// for that VM. Its key never leaves the host.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the certificate, for the guest's trust store.
	PEM []byte
}

// Validity of a VM's CA, and of the host certificates it signs (begun a
// day early: a guest clock behind the host's still takes them).
const (
	caValidity   = 20 * 365 * 24 * time.Hour
	leafValidity = 30 * 24 * time.Hour
	clockSlack   = 24 * time.Hour
)

func (s *Store) caPath(vm VMRef) string {
	return filepath.Join(s.dir, "ca", vm.Name+"-"+strconv.FormatInt(vm.Created.UnixMilli(), 10)+".age")
}

// VMCA is vm's CA, made on first use; its key is kept encrypted like the
// secrets. Another VM of the same name, and a fork, get their own.
func (s *Store) VMCA(vm VMRef) (*CA, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.caPath(vm)
	f, err := os.Open(p)
	if err == nil {
		defer f.Close()
		ca, err := s.readCA(f)
		if err != nil {
			return nil, fmt.Errorf("ca of vm %q: %w", vm.Name, err)
		}
		return ca, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("ca of vm %q: %w", vm.Name, err)
	}
	ca, keyPEM, err := newCA(vm.Name)
	if err != nil {
		return nil, fmt.Errorf("ca of vm %q: %w", vm.Name, err)
	}
	var buf bytes.Buffer
	w, err := age.Encrypt(&buf, s.id.Recipient())
	if err == nil {
		_, err = w.Write(append(keyPEM, ca.PEM...))
	}
	if err == nil {
		err = w.Close()
	}
	if err == nil {
		err = os.MkdirAll(filepath.Dir(p), 0o700)
	}
	if err == nil {
		err = atomicfile.Write(p, buf.Bytes(), 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("ca of vm %q: %w", vm.Name, err)
	}
	return ca, nil
}

// forgetCA removes vm's CA (the caller holds s.mu).
func (s *Store) forgetCA(vm VMRef) error {
	if err := os.Remove(s.caPath(vm)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove ca of vm %q: %w", vm.Name, err)
	}
	return nil
}

func (s *Store) readCA(r io.Reader) (*CA, error) {
	d, err := age.Decrypt(r, s.id)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(d, 64<<10))
	if err != nil {
		return nil, err
	}
	ca := &CA{}
	for blk, rest := pem.Decode(b); blk != nil; blk, rest = pem.Decode(rest) {
		switch blk.Type {
		case "EC PRIVATE KEY":
			ca.key, err = x509.ParseECPrivateKey(blk.Bytes)
		case "CERTIFICATE":
			ca.cert, err = x509.ParseCertificate(blk.Bytes)
			ca.PEM = pem.EncodeToMemory(blk)
		}
		if err != nil {
			return nil, err
		}
	}
	if ca.key == nil || ca.cert == nil {
		return nil, errors.New("the file holds no key and certificate")
	}
	return ca, nil
}

// newCA makes a CA for a VM: the CA and its key as PEM.
func newCA(vm string) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "den vm " + vm + " secrets CA", Organization: []string{"den"}},
		NotBefore:             now.Add(-clockSlack),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// leaf is a certificate for host signed by the CA.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-clockSlack),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
