package machine

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/denhq/den/registry"
	"github.com/denhq/den/sshgw"
)

// DefaultOwner owns VMs and keys created without a user.
const DefaultOwner = "default"

var userRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._@-]{0,63}$`)

// ValidateUser checks a user name: 1 to 64 letters, digits, '.', '_',
// '@' or '-', starting with a letter or digit.
func ValidateUser(user string) error {
	if !userRE.MatchString(user) {
		return fmt.Errorf("bad user name %q: use letters, digits, '.', '_', '@' or '-' (at most 64): %w", user, ErrInvalid)
	}
	return nil
}

// AddKey registers an SSH public key (authorized_keys form) for user
// (DefaultOwner when empty): the key then logs in to the SSH gateway as
// that user. name labels it (default: the key's comment).
func (m *Manager) AddKey(ctx context.Context, user, name string, publicKey []byte) (registry.Key, error) {
	if user == "" {
		user = DefaultOwner
	}
	if err := ValidateUser(user); err != nil {
		return registry.Key{}, err
	}
	pk, err := sshgw.ParseAuthorizedKey(publicKey)
	if err != nil {
		return registry.Key{}, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if name == "" {
		name = pk.Comment
	}
	if len(name) > 128 {
		return registry.Key{}, fmt.Errorf("key name longer than 128 bytes: %w", ErrInvalid)
	}
	k := registry.Key{Fingerprint: pk.Fingerprint, User: user, Name: name, PublicKey: pk.Line,
		CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if err := m.db.AddKey(ctx, k); err != nil {
		if errors.Is(err, registry.ErrExists) {
			// Whose it is stays unsaid: the caller may not be root.
			return registry.Key{}, fmt.Errorf("key %s is registered already: %w", pk.Fingerprint, ErrExists)
		}
		return registry.Key{}, err
	}
	return k, nil
}

// ListKeys returns the registered keys, of user only when set.
func (m *Manager) ListKeys(ctx context.Context, user string) ([]registry.Key, error) {
	return m.db.ListKeys(ctx, user)
}

// RemoveKey unregisters the key whose fingerprint or name is ref (of
// user only, when set) and returns it.
func (m *Manager) RemoveKey(ctx context.Context, user, ref string) (registry.Key, error) {
	k, err := m.db.RemoveKey(ctx, user, ref)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return k, fmt.Errorf("no key %q: %w", ref, ErrNotFound)
	case errors.Is(err, registry.ErrAmbiguous):
		return k, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	return k, err
}

// UserForKey returns the user a key fingerprint logs in as; ErrNotFound
// for an unregistered key.
func (m *Manager) UserForKey(ctx context.Context, fingerprint string) (string, error) {
	u, err := m.db.UserForKey(ctx, fingerprint)
	if errors.Is(err, registry.ErrNotFound) {
		return "", fmt.Errorf("unknown key %s: %w", fingerprint, ErrNotFound)
	}
	return u, err
}
