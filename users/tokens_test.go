package users

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/denhq/den/registry"
)

// countingStore counts the store's lookups and touches; age moves the
// last use its lookups report into the past.
type countingStore struct {
	registry.TokenStore
	lookups, touches atomic.Int32
	age              time.Duration
}

func (s *countingStore) TokenByHash(ctx context.Context, hash string) (registry.Token, error) {
	s.lookups.Add(1)
	tok, err := s.TokenStore.TokenByHash(ctx, hash)
	if !tok.LastUsed.IsZero() {
		tok.LastUsed = tok.LastUsed.Add(-s.age)
	}
	return tok, err
}

func (s *countingStore) TouchToken(ctx context.Context, id string, t time.Time) error {
	s.touches.Add(1)
	return s.TokenStore.TouchToken(ctx, id, t)
}

func openTokens(t *testing.T) (Tokens, *countingStore, *registry.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "den.db")
	db, err := registry.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cs := &countingStore{TokenStore: db}
	return Tokens{Store: cs}, cs, db, path
}

func TestTokenCreateVerify(t *testing.T) {
	ctx := context.Background()
	toks, _, _, _ := openTokens(t)

	secret, tok, err := toks.Create(ctx, "alice", "ci", false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "den_") || len(secret) != 47 || !wellFormed(secret) {
		t.Fatalf("secret %q", secret)
	}
	if !strings.HasPrefix(tok.ID, "tok_") || len(tok.ID) != 12 || tok.User != "alice" || tok.Name != "ci" || tok.Admin ||
		tok.Hash != HashSecret(secret) || tok.CreatedAt.IsZero() {
		t.Fatalf("token %+v", tok)
	}
	got, err := toks.Verify(ctx, secret)
	if err != nil || got.ID != tok.ID || got.User != "alice" || got.Admin {
		t.Fatalf("verify: %+v %v", got, err)
	}

	// Two tokens never share a secret or an id.
	secret2, tok2, err := toks.Create(ctx, "alice", "laptop", false)
	if err != nil || secret2 == secret || tok2.ID == tok.ID {
		t.Fatalf("second token: %v %v", tok2, err)
	}
	// A name is unique per user, not across users.
	if _, _, err := toks.Create(ctx, "alice", "ci", false); !errors.Is(err, ErrExists) {
		t.Fatalf("same name twice: %v", err)
	}
	if _, _, err := toks.Create(ctx, "bob", "ci", false); err != nil {
		t.Fatalf("another user's name: %v", err)
	}
	// No user defaults to the default owner, like keys.
	if _, tok, err := toks.Create(ctx, "", "x", false); err != nil || tok.User != registry.DefaultOwner {
		t.Fatalf("no user: %+v %v", tok, err)
	}

	for what, c := range map[string][2]string{
		"bad user":         {"../etc", "x"},
		"no name":          {"alice", ""},
		"name with space":  {"alice", "my token"},
		"name like an id":  {"alice", "tok_0a1b2c3d"},
		"name with a NUL":  {"alice", "a\x00"},
		"name of 65 bytes": {"alice", strings.Repeat("n", 65)},
	} {
		if _, _, err := toks.Create(ctx, c[0], c[1], false); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", what, err)
		}
	}
}

func TestTokenAdminKept(t *testing.T) {
	ctx := context.Background()
	toks, _, db, path := openTokens(t)
	secret, tok, err := toks.Create(ctx, "root", "ops", true)
	if err != nil || !tok.Admin {
		t.Fatalf("create: %+v %v", tok, err)
	}
	db.Close()
	db, err = registry.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	toks = Tokens{Store: db}
	if got, err := toks.Verify(ctx, secret); err != nil || !got.Admin || got.User != "root" {
		t.Fatalf("verify after reopen: %+v %v", got, err)
	}
	list, err := toks.List(ctx, "root")
	if err != nil || len(list) != 1 || !list[0].Admin {
		t.Fatalf("list: %+v %v", list, err)
	}
}

func TestTokenRefused(t *testing.T) {
	ctx := context.Background()
	toks, cs, _, _ := openTokens(t)
	secret, tok, err := toks.Create(ctx, "alice", "ci", false)
	if err != nil {
		t.Fatal(err)
	}

	// Malformed: refused without a lookup, and never quoted back.
	before := cs.lookups.Load()
	for _, bad := range []string{
		"", "den_", "Bearer " + secret, secret + "=", secret + "A", secret[:len(secret)-1],
		" " + secret[1:], "DEN_" + secret[4:], "den_" + strings.Repeat("+", 43), tok.ID, tok.Hash,
		secret[:len(secret)-1] + "B", // 43 characters whose last one carries bits past 32 bytes
	} {
		_, err := toks.Verify(ctx, bad)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("malformed %q: %v", bad, err)
		}
		if err != nil && len(bad) > 8 && strings.Contains(err.Error(), bad) {
			t.Errorf("the error quotes the secret: %v", err)
		}
	}
	if n := cs.lookups.Load() - before; n != 0 {
		t.Errorf("%d store lookups for malformed secrets", n)
	}

	// Wrong: well formed, but no token has it.
	wrong, _, err := newSecret()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toks.Verify(ctx, wrong); !errors.Is(err, ErrNotFound) {
		t.Fatalf("wrong secret: %v", err)
	}
	// One character changed.
	flip := []byte(secret)
	flip[10] = 'A'
	if secret[10] == 'A' {
		flip[10] = 'B'
	}
	if _, err := toks.Verify(ctx, string(flip)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("secret with one character changed: %v", err)
	}

	// Revoked.
	if _, err := toks.Verify(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if _, err := toks.Remove(ctx, "alice", "ci"); err != nil {
		t.Fatal(err)
	}
	if _, err := toks.Verify(ctx, secret); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoked token: %v", err)
	}
}

func TestTokenRemoveOwnOnly(t *testing.T) {
	ctx := context.Background()
	toks, _, _, _ := openTokens(t)
	aliceSecret, alice, err := toks.Create(ctx, "alice", "ci", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := toks.Create(ctx, "bob", "ci", false); err != nil {
		t.Fatal(err)
	}
	// bob cannot remove alice's token, by id or by a name they share.
	if _, err := toks.Remove(ctx, "bob", alice.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob removes alice's token by id: %v", err)
	}
	if got, err := toks.Remove(ctx, "bob", "ci"); err != nil || got.User != "bob" {
		t.Fatalf("bob removes his own: %+v %v", got, err)
	}
	if _, err := toks.Verify(ctx, aliceSecret); err != nil {
		t.Fatalf("alice's token after bob's removals: %v", err)
	}
	if _, err := toks.Remove(ctx, "alice", "den_x/y"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad ref: %v", err)
	}
	// Any user's (an admin's call): by id.
	if got, err := toks.Remove(ctx, "", alice.ID); err != nil || got.User != "alice" {
		t.Fatalf("admin removes by id: %+v %v", got, err)
	}
	if list, err := toks.List(ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("left: %+v %v", list, err)
	}
}

func TestTokenAmbiguous(t *testing.T) {
	ctx := context.Background()
	toks, _, _, _ := openTokens(t)
	for _, u := range []string{"alice", "bob"} {
		if _, _, err := toks.Create(ctx, u, "ci", false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := toks.Remove(ctx, "", "ci"); !errors.Is(err, ErrInvalid) || !errors.Is(err, registry.ErrAmbiguous) {
		t.Fatalf("a name two users share, for any user: %v", err)
	}
}

// TestTokenNotInClear: the database files hold the secret's hash, never
// the secret (nor its random part).
func TestTokenNotInClear(t *testing.T) {
	ctx := context.Background()
	toks, _, db, path := openTokens(t)
	var secrets []string
	for _, name := range []string{"a", "b", "c"} {
		secret, _, err := toks.Create(ctx, "alice", name, name == "a")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := toks.Verify(ctx, secret); err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, secret)
	}
	scan := func() []byte {
		var all []byte
		files, _ := filepath.Glob(path + "*") // den.db, den.db-wal, den.db-shm
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, b...)
		}
		return all
	}
	check := func(when string, data []byte) {
		for _, s := range secrets {
			if !bytes.Contains(data, []byte(HashSecret(s))) {
				t.Fatalf("%s: the hash is not in the files: the scan reads nothing", when)
			}
			for _, part := range []string{s, s[len(SecretPrefix):], s[len(SecretPrefix) : len(SecretPrefix)+16]} {
				if bytes.Contains(data, []byte(part)) {
					t.Fatalf("%s: the secret %q is stored in clear", when, part)
				}
			}
		}
	}
	check("open", scan()) // the write-ahead log holds the rows
	db.Close()
	check("closed", scan()) // checkpointed into the database file
}

// TestTokenTouch: Verify records a use at most once per TouchEvery.
func TestTokenTouch(t *testing.T) {
	ctx := context.Background()
	toks, cs, _, _ := openTokens(t)
	secret, _, err := toks.Create(ctx, "alice", "ci", false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := toks.Verify(ctx, secret)
	if err != nil || got.LastUsed.IsZero() || cs.touches.Load() != 1 {
		t.Fatalf("first use: %+v %v, %d touches", got, err, cs.touches.Load())
	}
	for range 10 {
		if _, err := toks.Verify(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	if n := cs.touches.Load(); n != 1 {
		t.Fatalf("%d touches within a minute, want 1", n)
	}
	cs.age = TouchEvery // the last use recorded is a minute old
	if _, err := toks.Verify(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if n := cs.touches.Load(); n != 2 {
		t.Fatalf("%d touches after a minute, want 2", n)
	}
	list, _ := toks.List(ctx, "alice")
	if len(list) != 1 || list[0].LastUsed.IsZero() {
		t.Fatalf("list: %+v", list)
	}
}
