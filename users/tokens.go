package users

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/registry"
)

// An API token's secret is SecretPrefix and SecretBytes random bytes in
// unpadded base64url: "den_" and 43 characters.
const (
	SecretPrefix = "den_"
	SecretBytes  = 32
	secretLen    = len(SecretPrefix) + (SecretBytes*8+5)/6
)

// TouchEvery is how often Verify records a token's last use at most.
const TouchEvery = time.Minute

// Tokens manages users' API bearer tokens in a token store. The store
// keeps only the SHA-256 of each secret: a secret is shown once, by
// Create, and cannot be read back.
type Tokens struct {
	Store registry.TokenStore
}

// Create makes a token for user (registry.DefaultOwner when empty),
// named name (unique among the user's tokens), an admin token when admin
// is set, and returns its secret (shown once, never stored) and its
// record. Whether the caller may grant admin is the caller's to decide.
func (t Tokens) Create(ctx context.Context, user, name string, admin bool) (string, registry.Token, error) {
	if user == "" {
		user = registry.DefaultOwner
	}
	if err := Validate(user); err != nil {
		return "", registry.Token{}, err
	}
	if err := validate.TokenName(name); err != nil {
		return "", registry.Token{}, err
	}
	// A new id (32 bits) may collide with another token's: try again.
	for range 4 {
		secret, id, err := newSecret()
		if err != nil {
			return "", registry.Token{}, err
		}
		tok := registry.Token{ID: id, User: user, Name: name, Admin: admin, Hash: HashSecret(secret),
			CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
		err = t.Store.AddToken(ctx, tok)
		if err == nil {
			return secret, tok, nil
		}
		if !errors.Is(err, registry.ErrExists) {
			return "", registry.Token{}, err
		}
		if taken, lerr := t.nameTaken(ctx, user, name); lerr != nil {
			return "", registry.Token{}, lerr
		} else if taken {
			return "", registry.Token{}, fmt.Errorf("a token named %q exists already: %w", name, ErrExists)
		}
	}
	return "", registry.Token{}, fmt.Errorf("create token %q: no free token id found", name)
}

// nameTaken says whether user has a token named name.
func (t Tokens) nameTaken(ctx context.Context, user, name string) (bool, error) {
	toks, err := t.Store.ListTokens(ctx, user)
	if err != nil {
		return false, err
	}
	for _, tok := range toks {
		if tok.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// newSecret returns a new secret and a new token id, both random.
func newSecret() (secret, id string, err error) {
	b := make([]byte, SecretBytes+4)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("create token: %w", err)
	}
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b[:SecretBytes]), "tok_" + hex.EncodeToString(b[SecretBytes:]), nil
}

// HashSecret is what the store keeps of a secret: its SHA-256 in hex.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// wellFormed says whether s has the form of a secret Create returns.
func wellFormed(s string) bool {
	if len(s) != secretLen || !strings.HasPrefix(s, SecretPrefix) {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s[len(SecretPrefix):])
	return err == nil && len(b) == SecretBytes
}

// List returns the tokens, of user only when set.
func (t Tokens) List(ctx context.Context, user string) ([]registry.Token, error) {
	return t.Store.ListTokens(ctx, user)
}

// Remove revokes the token whose id or name is ref (of user only, when
// set) and returns it. Another user's token is not found.
func (t Tokens) Remove(ctx context.Context, user, ref string) (registry.Token, error) {
	if err := validate.TokenRef(ref); err != nil {
		return registry.Token{}, err
	}
	tok, err := t.Store.RemoveToken(ctx, user, ref)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return tok, fmt.Errorf("no token %q: %w", ref, ErrNotFound)
	case errors.Is(err, registry.ErrAmbiguous):
		return tok, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	return tok, err
}

// Verify returns the token whose secret is secret. A string not of a
// secret's form is refused without asking the store (ErrInvalid); a
// secret no token has, such as a revoked token's, wraps ErrNotFound.
// An API answers both the same way (401), and no error quotes the
// secret. Verify records the token's use when the last one recorded is
// TouchEvery old or more (a failure to record it does not fail Verify).
func (t Tokens) Verify(ctx context.Context, secret string) (registry.Token, error) {
	if !wellFormed(secret) {
		return registry.Token{}, fmt.Errorf("not a den api token (want %s and %d base64url characters): %w", SecretPrefix, secretLen-len(SecretPrefix), ErrInvalid)
	}
	hash := HashSecret(secret)
	tok, err := t.Store.TokenByHash(ctx, hash)
	if errors.Is(err, registry.ErrNotFound) {
		return registry.Token{}, fmt.Errorf("unknown or revoked api token: %w", ErrNotFound)
	}
	if err != nil {
		return registry.Token{}, err
	}
	// The store matched the hash; check it again without a timing leak,
	// in case a store matches loosely.
	if subtle.ConstantTimeCompare([]byte(tok.Hash), []byte(hash)) != 1 {
		return registry.Token{}, fmt.Errorf("unknown or revoked api token: %w", ErrNotFound)
	}
	if now := time.Now().UTC(); now.Sub(tok.LastUsed) >= TouchEvery {
		if t.Store.TouchToken(ctx, tok.ID, now) == nil {
			tok.LastUsed = now.Truncate(time.Millisecond)
		}
	}
	return tok, nil
}
