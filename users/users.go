// Package users keeps who may reach den from afar: user names, the SSH
// public keys they log in to the gateway with, and the bearer tokens
// they call the API with, in the registry.
package users

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/registry"
)

// Errors callers map onto answers.
var (
	ErrInvalid  = validate.ErrInvalid
	ErrExists   = errors.New("already exists")
	ErrNotFound = errors.New("not found")
)

// Validate checks a user name: 1 to 64 letters, digits, '.', '_', '@' or
// '-', starting with a letter or digit (validate.User).
func Validate(user string) error { return validate.User(user) }

// Keys manages users' keys in a key store.
type Keys struct {
	Store registry.KeyStore
}

// Add registers an SSH public key (authorized_keys form) for user
// (registry.DefaultOwner when empty): the key then logs in to the SSH
// gateway as that user. name labels it (default: the key's comment).
func (k Keys) Add(ctx context.Context, user, name string, publicKey []byte) (registry.Key, error) {
	if user == "" {
		user = registry.DefaultOwner
	}
	if err := Validate(user); err != nil {
		return registry.Key{}, err
	}
	if err := validate.PublicKey(string(publicKey)); err != nil {
		return registry.Key{}, err
	}
	pk, err := ParseAuthorizedKey(publicKey)
	if err != nil {
		return registry.Key{}, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if name == "" {
		name = pk.Comment
	}
	if err := validate.KeyName(name); err != nil {
		return registry.Key{}, err
	}
	key := registry.Key{Fingerprint: pk.Fingerprint, User: user, Name: name, PublicKey: pk.Line,
		CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if err := k.Store.AddKey(ctx, key); err != nil {
		if errors.Is(err, registry.ErrExists) {
			// Whose it is stays unsaid: the caller may not be root.
			return registry.Key{}, fmt.Errorf("key %s is registered already: %w", pk.Fingerprint, ErrExists)
		}
		return registry.Key{}, err
	}
	return key, nil
}

// List returns the registered keys, of user only when set.
func (k Keys) List(ctx context.Context, user string) ([]registry.Key, error) {
	return k.Store.ListKeys(ctx, user)
}

// Remove unregisters the key whose fingerprint or name is ref (of user
// only, when set) and returns it.
func (k Keys) Remove(ctx context.Context, user, ref string) (registry.Key, error) {
	if err := validate.KeyRef(ref); err != nil {
		return registry.Key{}, err
	}
	key, err := k.Store.RemoveKey(ctx, user, ref)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return key, fmt.Errorf("no key %q: %w", ref, ErrNotFound)
	case errors.Is(err, registry.ErrAmbiguous):
		return key, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	return key, err
}

// UserFor returns the user a key fingerprint logs in as; ErrNotFound for
// an unregistered key.
func (k Keys) UserFor(ctx context.Context, fingerprint string) (string, error) {
	u, err := k.Store.UserForKey(ctx, fingerprint)
	if errors.Is(err, registry.ErrNotFound) {
		return "", fmt.Errorf("unknown key %s: %w", fingerprint, ErrNotFound)
	}
	return u, err
}
