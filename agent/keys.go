package agent

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/denhq/den/internal/atomicfile"
	"golang.org/x/crypto/ssh"
)

// CmdlineKey is the kernel command line parameter that carries a public
// key the agent accepts.
const CmdlineKey = "den.key"

// LoadOrCreateHostKey loads the ed25519 private key at path (OpenSSH
// format), creating it (mode 0600, written atomically) if it does not
// exist. The den daemon uses it as its client key for the agents.
func LoadOrCreateHostKey(path string) (ssh.Signer, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		s, err := ssh.ParsePrivateKey(data)
		if err != nil {
			return nil, fmt.Errorf("load key %s: %w", path, err)
		}
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load key %s: %w", path, err)
	}
	pemData, s, err := NewEd25519Key("den")
	if err != nil {
		return nil, fmt.Errorf("create key %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create key %s: %w", path, err)
	}
	if err := atomicfile.Write(path, pemData, 0o600); err != nil {
		return nil, fmt.Errorf("create key %s: %w", path, err)
	}
	return s, nil
}

// NewEd25519Key returns a new ed25519 key as OpenSSH PEM and as a signer.
func NewEd25519Key(comment string) ([]byte, ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate ed25519 key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal ed25519 key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, fmt.Errorf("ed25519 signer: %w", err)
	}
	return pem.EncodeToMemory(block), s, nil
}

// AuthorizedKeyArg is the kernel command line argument that makes the
// agent accept pub: den.key=<type>:<base64 of the wire form>.
func AuthorizedKeyArg(pub ssh.PublicKey) string {
	return CmdlineKey + "=" + pub.Type() + ":" + base64.StdEncoding.EncodeToString(pub.Marshal())
}

// ParseAuthorizedKeyArg parses the value of a den.key parameter
// ("<type>:<base64>").
func ParseAuthorizedKeyArg(v string) (ssh.PublicKey, error) {
	typ, b64, ok := strings.Cut(v, ":")
	if !ok {
		return nil, fmt.Errorf("parse %s %q: want <type>:<base64>", CmdlineKey, v)
	}
	wire, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("parse %s %q: %w", CmdlineKey, v, err)
	}
	pub, err := ssh.ParsePublicKey(wire)
	if err != nil {
		return nil, fmt.Errorf("parse %s %q: %w", CmdlineKey, v, err)
	}
	if pub.Type() != typ {
		return nil, fmt.Errorf("parse %s: key is %s, labelled %s", CmdlineKey, pub.Type(), typ)
	}
	return pub, nil
}

// PinnedHostKey returns a host key callback for trust on first use: with
// known nil it calls record with the agent's key (an error from record
// refuses the connection) and accepts it; otherwise it accepts only known.
func PinnedHostKey(known ssh.PublicKey, record func(ssh.PublicKey) error) ssh.HostKeyCallback {
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		if known == nil {
			if record != nil {
				if err := record(key); err != nil {
					return fmt.Errorf("record agent host key: %w", err)
				}
			}
			return nil
		}
		if !bytes.Equal(known.Marshal(), key.Marshal()) {
			return fmt.Errorf("agent host key %s does not match the recorded %s",
				ssh.FingerprintSHA256(key), ssh.FingerprintSHA256(known))
		}
		return nil
	}
}
