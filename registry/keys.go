package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrAmbiguous is wrapped when a key or token name matches more than one
// key or token.
var ErrAmbiguous = errors.New("ambiguous")

// Key is one user's SSH public key: it logs the user in to the SSH
// gateway.
type Key struct {
	// Fingerprint is the key's SHA256 fingerprint ("SHA256:..."), unique.
	Fingerprint string `json:"fingerprint"`
	User        string `json:"user"`
	// Name is a label (by default the key's comment); not unique.
	Name string `json:"name"`
	// PublicKey is the key in authorized_keys form, without options.
	PublicKey string    `json:"public_key"`
	CreatedAt time.Time `json:"created_at"`
}

const keyColumns = `fingerprint, "user", name, public_key, created_at`

func scanKey(s scanner) (Key, error) {
	var k Key
	var created int64
	err := s.Scan(&k.Fingerprint, &k.User, &k.Name, &k.PublicKey, &created)
	k.CreatedAt = time.UnixMilli(created).UTC()
	return k, err
}

// AddKey records a key; ErrExists when its fingerprint is recorded
// already (for any user).
func (d *DB) AddKey(ctx context.Context, k Key) error {
	if err := checkKey(k); err != nil {
		return err
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = time.Now().UTC()
	}
	_, err := d.db.ExecContext(ctx, `INSERT INTO keys (`+keyColumns+`) VALUES (?,?,?,?,?)`,
		k.Fingerprint, k.User, k.Name, k.PublicKey, k.CreatedAt.UnixMilli())
	if err != nil {
		if _, ok := d.db.d.unique(err); ok {
			return fmt.Errorf("key %s: %w", k.Fingerprint, ErrExists)
		}
		return fmt.Errorf("record key %s: %w", k.Fingerprint, err)
	}
	return nil
}

// keysTable lists and removes keys.
var keysTable = owned[Key]{table: "keys", columns: keyColumns, idColumn: "fingerprint", what: "key", idWhat: "fingerprint",
	scan: scanKey, id: func(k Key) string { return k.Fingerprint }}

// ListKeys returns the keys ordered by user, then date; of one user when
// user is set.
func (d *DB) ListKeys(ctx context.Context, user string) ([]Key, error) {
	return keysTable.list(ctx, d.db, user)
}

// RemoveKey deletes the key whose fingerprint or name is ref (of user
// only, when user is set) and returns it: ErrNotFound when none matches,
// ErrAmbiguous when a name matches several keys.
func (d *DB) RemoveKey(ctx context.Context, user, ref string) (Key, error) {
	return keysTable.remove(ctx, d.db, user, ref)
}

// UserForKey returns the user whose key has this fingerprint;
// ErrNotFound when no user has it.
func (d *DB) UserForKey(ctx context.Context, fingerprint string) (string, error) {
	var user string
	err := d.db.QueryRowContext(ctx, `SELECT "user" FROM keys WHERE fingerprint = ?`, fingerprint).Scan(&user)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("key %s: %w", fingerprint, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("look up key %s: %w", fingerprint, err)
	}
	return user, nil
}
