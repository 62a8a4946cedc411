//go:build linux

package guest

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/gliderlabs/ssh"
)

// Where den's CA goes in the guest: a file update-ca-certificates keeps
// in the bundle it makes, and the bundle itself (Debian's, which
// OpenSSL, GnuTLS and Go read).
const (
	caFile   = "usr/local/share/ca-certificates/den-secrets-ca.crt"
	caBundle = "etc/ssl/certs/ca-certificates.crt"
)

// denCA says whether a certificate is one of den's VM CAs.
func denCA(c *x509.Certificate) bool {
	return c.IsCA && len(c.Subject.Organization) == 1 && c.Subject.Organization[0] == "den" &&
		strings.HasPrefix(c.Subject.CommonName, "den vm ") && strings.HasSuffix(c.Subject.CommonName, " secrets CA")
}

// trustCA puts CA certificate certPEM in the trust store of the system at
// root, in place of any CA of den's before (a fork has the source's),
// and returns the file that holds it alone.
func trustCA(root string, certPEM []byte) (string, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return "", errors.New("trust ca: not a PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || !denCA(c) {
		return "", fmt.Errorf("trust ca: not a CA of den's (%v)", err)
	}
	certPEM = pem.EncodeToMemory(blk)
	file := filepath.Join(root, caFile)
	if old, err := os.ReadFile(file); err != nil || !bytes.Equal(old, certPEM) {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return "", fmt.Errorf("trust ca: %w", err)
		}
		if err := atomicfile.Replace(file, certPEM, 0o644); err != nil {
			return "", fmt.Errorf("trust ca: %w", err)
		}
	}
	bundle := filepath.Join(root, caBundle)
	old, err := os.ReadFile(bundle)
	if errors.Is(err, fs.ErrNotExist) {
		return "/" + caFile, nil // no system bundle (no ca-certificates): the file alone
	}
	if err != nil {
		return "", fmt.Errorf("trust ca: %w", err)
	}
	// The bundle's certificates but den's CAs, then this one.
	var out bytes.Buffer
	rest := old
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			if bc, err := x509.ParseCertificate(b.Bytes); err == nil && denCA(bc) {
				continue
			}
		}
		out.Write(pem.EncodeToMemory(b))
	}
	out.Write(certPEM)
	if !bytes.Equal(out.Bytes(), old) {
		if err := atomicfile.Replace(bundle, out.Bytes(), 0o644); err != nil {
			return "", fmt.Errorf("trust ca: %w", err)
		}
	}
	return "/" + caFile, nil
}

// envRE is a session variable den's HTTPS secrets may set.
var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}=den-secret:[A-Za-z][A-Za-z0-9_.-]{0,63}$`)

// ctlSecrets answers agent.ReqSecrets: new sessions get the placeholders
// (and NODE_EXTRA_CA_CERTS, Node reading no system store), the trust
// store the CA.
func (s *Server) ctlSecrets(_ ssh.Context, payload []byte) (any, error) {
	var req agent.SecretsRequest
	if err := decode("secrets", payload, &req); err != nil {
		return nil, err
	}
	for _, kv := range req.Env {
		if !envRE.MatchString(kv) {
			return nil, fmt.Errorf("secrets: bad variable %q", kv)
		}
	}
	var reply agent.SecretsReply
	if req.CA != "" {
		if s.sys.TrustCA == nil {
			return nil, errors.New("secrets: this agent does not install CAs")
		}
		file, err := s.sys.TrustCA([]byte(req.CA))
		if err != nil {
			return nil, err
		}
		reply.CAFile = file
	}
	env := append([]string(nil), req.Env...)
	if reply.CAFile != "" && len(env) > 0 {
		env = append(env, "NODE_EXTRA_CA_CERTS="+reply.CAFile)
	}
	s.secretEnv.Store(&env)
	return reply, nil
}
