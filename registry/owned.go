package registry

import (
	"context"
	"database/sql"
	"fmt"
)

// owned describes a table of things users own, each found by a unique
// id or by a name that need not be unique: keys (by fingerprint) and
// API tokens (by id). Listing and removal work the same for both.
type owned[T any] struct {
	table, columns string
	idColumn       string // the unique column (fingerprint, id)
	what, idWhat   string // "key", "fingerprint": for messages
	scan           func(scanner) (T, error)
	id             func(T) string
}

// collect scans every row of rows (which it closes).
func collect[T any](rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// list returns the rows ordered by user, then date; of one user when
// user is set.
func (o owned[T]) list(ctx context.Context, db *conn, user string) ([]T, error) {
	q := `SELECT ` + o.columns + ` FROM ` + o.table
	var args []any
	if user != "" {
		q += ` WHERE "user" = ?`
		args = append(args, user)
	}
	rows, err := db.QueryContext(ctx, q+` ORDER BY "user", created_at, `+o.idColumn, args...)
	if err != nil {
		return nil, fmt.Errorf("list %ss: %w", o.what, err)
	}
	out, err := collect(rows, o.scan)
	if err != nil {
		return nil, fmt.Errorf("list %ss: %w", o.what, err)
	}
	return out, nil
}

// remove deletes the row whose id or name is ref (of user only, when
// user is set) and returns it: ErrNotFound when none matches,
// ErrAmbiguous when a name matches several.
func (o owned[T]) remove(ctx context.Context, db *conn, user, ref string) (T, error) {
	var zero T
	tx, err := db.BeginTx(ctx)
	if err != nil {
		return zero, fmt.Errorf("remove %s %q: %w", o.what, ref, err)
	}
	defer tx.Rollback()
	q := `SELECT ` + o.columns + ` FROM ` + o.table + ` WHERE (` + o.idColumn + ` = ? OR name = ?)`
	args := []any{ref, ref}
	if user != "" {
		q += ` AND "user" = ?`
		args = append(args, user)
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return zero, fmt.Errorf("remove %s %q: %w", o.what, ref, err)
	}
	found, err := collect(rows, o.scan)
	if err != nil {
		return zero, fmt.Errorf("remove %s %q: %w", o.what, ref, err)
	}
	// An id is unique; prefer it over names that happen to match.
	for _, v := range found {
		if o.id(v) == ref {
			found = []T{v}
			break
		}
	}
	switch len(found) {
	case 0:
		return zero, fmt.Errorf("no %s %q: %w", o.what, ref, ErrNotFound)
	case 1:
	default:
		return zero, fmt.Errorf("%s name %q matches %d %ss, remove one by its %s: %w", o.what, ref, len(found), o.what, o.idWhat, ErrAmbiguous)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM `+o.table+` WHERE `+o.idColumn+` = ?`, o.id(found[0]))
	if err != nil {
		return zero, fmt.Errorf("remove %s %q: %w", o.what, ref, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		// Removed meanwhile, by another host.
		return zero, fmt.Errorf("no %s %q: %w", o.what, ref, ErrNotFound)
	}
	if err := tx.Commit(); err != nil {
		return zero, fmt.Errorf("remove %s %q: %w", o.what, ref, err)
	}
	return found[0], nil
}
