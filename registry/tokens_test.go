package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/validate"
)

func hashOf(c byte) string { return strings.Repeat(string(c), 64) }

func TestTokens(t *testing.T) { eachBackend(t, testTokens) }

func testTokens(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	toks := []Token{
		{ID: "tok_0000000a", User: "alice", Name: "ci", Hash: hashOf('a'), Admin: true},
		{ID: "tok_0000000b", User: "alice", Name: "laptop", Hash: hashOf('b')},
		{ID: "tok_0000000c", User: "bob", Name: "ci", Hash: hashOf('c')},
	}
	for _, tok := range toks {
		if err := db.AddToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	for what, tok := range map[string]Token{
		"same id":   {ID: "tok_0000000a", User: "carol", Name: "x", Hash: hashOf('d')},
		"same hash": {ID: "tok_0000000d", User: "carol", Name: "x", Hash: hashOf('a')},
		"same name": {ID: "tok_0000000d", User: "alice", Name: "ci", Hash: hashOf('d')},
	} {
		if err := db.AddToken(ctx, tok); !errors.Is(err, ErrExists) {
			t.Errorf("%s: %v", what, err)
		}
	}
	for what, tok := range map[string]Token{
		"bad id":   {ID: "tok_x", User: "carol", Name: "x", Hash: hashOf('d')},
		"bad user": {ID: "tok_0000000d", User: "../x", Name: "x", Hash: hashOf('d')},
		"bad name": {ID: "tok_0000000d", User: "carol", Name: "a b", Hash: hashOf('d')},
		"no hash":  {ID: "tok_0000000d", User: "carol", Name: "x"},
		"a secret": {ID: "tok_0000000d", User: "carol", Name: "x", Hash: "den_" + hashOf('d')[4:]},
	} {
		if err := db.AddToken(ctx, tok); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("%s: %v", what, err)
		}
	}

	got, err := db.TokenByHash(ctx, hashOf('a'))
	if err != nil || got.ID != "tok_0000000a" || got.User != "alice" || !got.Admin || got.CreatedAt.IsZero() || !got.LastUsed.IsZero() {
		t.Fatalf("by hash: %+v %v", got, err)
	}
	if _, err := db.TokenByHash(ctx, hashOf('z')); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown hash: %v", err)
	}

	// Last use only rises.
	t1 := time.Now().UTC().Truncate(time.Millisecond)
	if err := db.TouchToken(ctx, "tok_0000000a", t1); err != nil {
		t.Fatal(err)
	}
	if err := db.TouchToken(ctx, "tok_0000000a", t1.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.TokenByHash(ctx, hashOf('a')); !got.LastUsed.Equal(t1) {
		t.Fatalf("last used %v, want %v", got.LastUsed, t1)
	}
	if err := db.TouchToken(ctx, "tok_ffffffff", t1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("touch unknown: %v", err)
	}

	all, err := db.ListTokens(ctx, "")
	if err != nil || len(all) != 3 {
		t.Fatalf("list all: %+v %v", all, err)
	}
	mine, err := db.ListTokens(ctx, "alice")
	if err != nil || len(mine) != 2 || mine[0].User != "alice" || mine[1].User != "alice" {
		t.Fatalf("list alice: %+v %v", mine, err)
	}

	// A name two users share: ambiguous for root, not for one user.
	if _, err := db.RemoveToken(ctx, "", "ci"); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("ambiguous name: %v", err)
	}
	// bob cannot remove alice's token, even by its id.
	if _, err := db.RemoveToken(ctx, "bob", "tok_0000000a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other user's token: %v", err)
	}
	if tok, err := db.RemoveToken(ctx, "bob", "ci"); err != nil || tok.ID != "tok_0000000c" {
		t.Fatalf("remove by name: %+v %v", tok, err)
	}
	if tok, err := db.RemoveToken(ctx, "", "tok_0000000b"); err != nil || tok.Name != "laptop" {
		t.Fatalf("remove by id: %+v %v", tok, err)
	}
	if _, err := db.RemoveToken(ctx, "", "tok_0000000b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
	if _, err := db.TokenByHash(ctx, hashOf('b')); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed token still found: %v", err)
	}
	if got, err := db.TokenByHash(ctx, hashOf('a')); err != nil || !got.Admin {
		t.Fatalf("other token lost: %+v %v", got, err)
	}
}

// TestTokensMigration: a database made before the tokens table opens,
// keeps its records, and takes tokens.
func TestTokensMigration(t *testing.T) {
	ctx := context.Background()
	const before = 6 // schema steps before tokens
	if !strings.Contains(sqliteSchema[before], "CREATE TABLE tokens") {
		t.Fatalf("schema step %d is not the tokens table", before+1)
	}
	path := oldDatabase(t, before,
		`INSERT INTO vms (name, owner, image, cpus, memory_bytes, disk_bytes, state, created_at, last_active, generation)
			VALUES ('old', 'a', 'minimal', 1, 1, 1, 'sleeping', 0, 0, 7)`,
		`INSERT INTO keys (fingerprint, user, name, public_key, created_at) VALUES ('SHA256:aaa', 'a', 'k', 'ssh-ed25519 AAAA', 0)`,
	)
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if vm, err := db.GetVM(ctx, "old"); err != nil || vm.Generation != 7 {
		t.Fatalf("old vm after the migration: %+v %v", vm, err)
	}
	if u, err := db.UserForKey(ctx, "SHA256:aaa"); err != nil || u != "a" {
		t.Fatalf("old key after the migration: %q %v", u, err)
	}
	if err := db.AddToken(ctx, Token{ID: "tok_0000000a", User: "a", Name: "ci", Hash: hashOf('a')}); err != nil {
		t.Fatal(err)
	}
	if tok, err := db.TokenByHash(ctx, hashOf('a')); err != nil || tok.User != "a" {
		t.Fatalf("token after the migration: %+v %v", tok, err)
	}
}
