package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Token is an API bearer token: whoever presents its secret calls the API
// as User (and as an admin when Admin is set). The secret is not kept,
// only its hash.
type Token struct {
	// ID is the token's public id ("tok_" and 8 hex digits), unique.
	ID   string `json:"id"`
	User string `json:"user"`
	// Name is a label, unique among the user's tokens.
	Name  string `json:"name"`
	Admin bool   `json:"admin,omitempty"`
	// Hash is the hex SHA-256 of the secret, unique. It is never sent
	// to a client.
	Hash      string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	// LastUsed is when the token last authenticated a call, at a
	// minute's precision (zero: never).
	LastUsed time.Time `json:"last_used,omitzero"`
}

const tokenColumns = `id, "user", name, admin, hash, created_at, last_used`

func scanToken(s scanner) (Token, error) {
	var t Token
	var created, used int64
	err := s.Scan(&t.ID, &t.User, &t.Name, &t.Admin, &t.Hash, &created, &used)
	t.CreatedAt = time.UnixMilli(created).UTC()
	if used != 0 {
		t.LastUsed = time.UnixMilli(used).UTC()
	}
	return t, err
}

// millis is t in Unix milliseconds, 0 for the zero time.
func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// AddToken records a token; ErrExists when its id or hash is taken, or
// its user has a token of that name.
func (d *DB) AddToken(ctx context.Context, t Token) error {
	if err := checkToken(t); err != nil {
		return err
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now().UTC()
	}
	_, err := d.db.ExecContext(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES (?,?,?,?,?,?,?)`,
		t.ID, t.User, t.Name, t.Admin, t.Hash, t.CreatedAt.UnixMilli(), millis(t.LastUsed))
	if err != nil {
		// The unique constraint on (user, name) is SQLite's "tokens.user,
		// tokens.name", PostgreSQL's "tokens_user_name".
		if constraint, ok := d.db.d.unique(err); ok {
			if strings.Contains(constraint, "name") {
				return fmt.Errorf("token name %q of %q: %w", t.Name, t.User, ErrExists)
			}
			return fmt.Errorf("token %s: %w", t.ID, ErrExists)
		}
		return fmt.Errorf("record token %s: %w", t.ID, err)
	}
	return nil
}

// tokensTable lists and removes tokens.
var tokensTable = owned[Token]{table: "tokens", columns: tokenColumns, idColumn: "id", what: "token", idWhat: "id",
	scan: scanToken, id: func(t Token) string { return t.ID }}

// ListTokens returns the tokens ordered by user, then date; of one user
// when user is set.
func (d *DB) ListTokens(ctx context.Context, user string) ([]Token, error) {
	return tokensTable.list(ctx, d.db, user)
}

// RemoveToken deletes the token whose id or name is ref (of user only,
// when user is set) and returns it: ErrNotFound when none matches,
// ErrAmbiguous when a name matches several users' tokens.
func (d *DB) RemoveToken(ctx context.Context, user, ref string) (Token, error) {
	return tokensTable.remove(ctx, d.db, user, ref)
}

// TokenByHash returns the token whose secret hashes to hash; ErrNotFound
// when there is none. The error never quotes the hash.
func (d *DB) TokenByHash(ctx context.Context, hash string) (Token, error) {
	t, err := scanToken(d.db.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, fmt.Errorf("token: %w", ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("look up token: %w", err)
	}
	return t, nil
}

// TouchToken raises the token's last use to t (never lowers it);
// ErrNotFound when there is no token of that id.
func (d *DB) TouchToken(ctx context.Context, id string, t time.Time) error {
	res, err := d.db.ExecContext(ctx, `UPDATE tokens SET last_used = CASE WHEN last_used > ? THEN last_used ELSE ? END WHERE id = ?`, millis(t), millis(t), id)
	if err != nil {
		return fmt.Errorf("touch token %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("token %s: %w", id, ErrNotFound)
	}
	return nil
}
