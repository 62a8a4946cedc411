package registry

import (
	"context"
	"errors"
	"testing"
)

func TestKeys(t *testing.T) { eachBackend(t, testKeys) }

func testKeys(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	keys := []Key{
		{Fingerprint: "SHA256:aaa", User: "alice", Name: "laptop", PublicKey: "ssh-ed25519 AAAA1"},
		{Fingerprint: "SHA256:bbb", User: "alice", Name: "desktop", PublicKey: "ssh-ed25519 AAAA2"},
		{Fingerprint: "SHA256:ccc", User: "bob", Name: "laptop", PublicKey: "ssh-ed25519 AAAA3"},
	}
	for _, k := range keys {
		if err := db.AddKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	// A fingerprint belongs to one user only.
	dup := keys[0]
	dup.User = "bob"
	if err := db.AddKey(ctx, dup); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate fingerprint: %v", err)
	}

	if u, err := db.UserForKey(ctx, "SHA256:ccc"); err != nil || u != "bob" {
		t.Fatalf("user for ccc: %q %v", u, err)
	}
	if _, err := db.UserForKey(ctx, "SHA256:zzz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}

	all, err := db.ListKeys(ctx, "")
	if err != nil || len(all) != 3 {
		t.Fatalf("list all: %v %v", all, err)
	}
	mine, err := db.ListKeys(ctx, "alice")
	if err != nil || len(mine) != 2 || mine[0].User != "alice" || mine[0].CreatedAt.IsZero() {
		t.Fatalf("list alice: %+v %v", mine, err)
	}

	// A name shared by two users' keys: ambiguous for root, not for one user.
	if _, err := db.RemoveKey(ctx, "", "laptop"); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("ambiguous name: %v", err)
	}
	// bob cannot remove alice's key, even by its fingerprint.
	if _, err := db.RemoveKey(ctx, "bob", "SHA256:aaa"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other user's key: %v", err)
	}
	k, err := db.RemoveKey(ctx, "bob", "laptop")
	if err != nil || k.Fingerprint != "SHA256:ccc" {
		t.Fatalf("remove by name: %+v %v", k, err)
	}
	if k, err := db.RemoveKey(ctx, "", "SHA256:bbb"); err != nil || k.Name != "desktop" {
		t.Fatalf("remove by fingerprint: %+v %v", k, err)
	}
	if _, err := db.RemoveKey(ctx, "", "SHA256:bbb"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
	if _, err := db.UserForKey(ctx, "SHA256:bbb"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed key still logs in: %v", err)
	}
}
