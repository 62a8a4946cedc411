//go:build linux

package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/denhq/den/agent"
	gossh "golang.org/x/crypto/ssh"
)

// Where the agent keeps its keys in the guest.
const (
	// HostKeyPath is the agent's SSH host key.
	HostKeyPath = "/etc/den/ssh_host_ed25519_key"
	// RunHostKeyPath holds the host key when the root fs is read-only.
	RunHostKeyPath = "/run/den/ssh_host_ed25519_key"
	// AuthorizedKeysPath lists the host keys allowed in (authorized_keys
	// format).
	AuthorizedKeysPath = "/etc/den/authorized_keys"
)

// LoadOrCreateHostKey returns the first host key that loads or can be
// created at paths, in order (HostKeyPath, then RunHostKeyPath when the
// root fs is read-only), and the path it lives at.
func LoadOrCreateHostKey(paths ...string) (gossh.Signer, string, error) {
	var errs []error
	for _, p := range paths {
		s, err := agent.LoadOrCreateHostKey(p)
		if err == nil {
			return s, p, nil
		}
		errs = append(errs, err)
	}
	return nil, "", fmt.Errorf("agent host key: %w", errors.Join(errs...))
}

// AuthorizedKeys returns a function, called on each authentication, that
// reads file (if it exists) and adds the den.key values from the kernel
// command line. Bad entries are logged and skipped.
func AuthorizedKeys(file string, cmdlineKeys []string, log *slog.Logger) func() ([]gossh.PublicKey, error) {
	var fixed []gossh.PublicKey
	for _, v := range cmdlineKeys {
		k, err := agent.ParseAuthorizedKeyArg(v)
		if err != nil {
			log.Warn("ignoring kernel command line key", "err", err)
			continue
		}
		fixed = append(fixed, k)
	}
	return func() ([]gossh.PublicKey, error) {
		keys := append([]gossh.PublicKey(nil), fixed...)
		if file == "" {
			return keys, nil
		}
		data, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			return keys, nil
		}
		if err != nil {
			return keys, fmt.Errorf("read %s: %w", file, err)
		}
		for len(bytes.TrimSpace(data)) > 0 {
			k, _, _, rest, err := gossh.ParseAuthorizedKey(data)
			if err != nil {
				log.Warn("bad entry in authorized keys", "file", file, "err", err)
				break
			}
			keys = append(keys, k)
			data = rest
		}
		return keys, nil
	}
}
