package registry

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// dialect is what differs between the SQL of den's two backends. Queries
// are written once, with ? placeholders and quoted identifiers; the
// dialect rewrites what it must.
type dialect struct {
	name string
	// numbered: placeholders are $1, $2, ... (PostgreSQL), not ?.
	numbered bool
	// forUpdate locks the rows a SELECT reads until the transaction
	// ends (PostgreSQL; SQLite has one writer at a time anyway).
	forUpdate string
	// lock takes a transaction-scoped lock on key (PostgreSQL's advisory
	// locks); nil where transactions are serialised already.
	lock func(ctx context.Context, tx *txn, key string) error
	// now is an SQL expression of the database's clock, in Unix
	// milliseconds: leases and heartbeats are judged by this one clock,
	// never by the hosts' own.
	now string
	// unique tells whether err is a unique violation, and of which
	// constraint: SQLite's "table.column" list, PostgreSQL's name.
	unique func(err error) (string, bool)
}

var sqliteDialect = dialect{
	name: "sqlite",
	now:  `CAST(unixepoch('subsec') * 1000 AS INTEGER)`,
	unique: func(err error) (string, bool) {
		if err == nil {
			return "", false
		}
		msg := err.Error()
		i := strings.Index(msg, "UNIQUE constraint failed: ")
		if i < 0 {
			return "", false
		}
		return msg[i+len("UNIQUE constraint failed: "):], true
	},
}

var postgresDialect = dialect{
	name:      "postgres",
	numbered:  true,
	now:       `(extract(epoch from clock_timestamp()) * 1000)::bigint`,
	forUpdate: " FOR UPDATE",
	lock: func(ctx context.Context, tx *txn, key string) error {
		_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended(?, 0))`, key)
		return err
	},
	unique: func(err error) (string, bool) {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return pe.ConstraintName, true
		}
		return "", false
	},
}

// rebind turns ? placeholders into $n where the dialect numbers them.
// den's queries hold no ? inside string literals.
func (d dialect) rebind(q string) string {
	if !d.numbered || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// conn is the database in one dialect.
type conn struct {
	db *sql.DB
	d  dialect
}

func (c *conn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return c.db.ExecContext(ctx, c.d.rebind(q), args...)
}

func (c *conn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return c.db.QueryContext(ctx, c.d.rebind(q), args...)
}

func (c *conn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return c.db.QueryRowContext(ctx, c.d.rebind(q), args...)
}

func (c *conn) BeginTx(ctx context.Context) (*txn, error) {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &txn{tx: tx, d: c.d}, nil
}

// txn is a transaction in one dialect.
type txn struct {
	tx *sql.Tx
	d  dialect
}

func (t *txn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, t.d.rebind(q), args...)
}

func (t *txn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, t.d.rebind(q), args...)
}

func (t *txn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, t.d.rebind(q), args...)
}

// Lock takes the dialect's transaction-scoped lock on key, if it has one.
func (t *txn) Lock(ctx context.Context, key string) error {
	if t.d.lock == nil {
		return nil
	}
	return t.d.lock(ctx, t, key)
}

func (t *txn) Commit() error   { return t.tx.Commit() }
func (t *txn) Rollback() error { return t.tx.Rollback() }

// queryRower is a conn or a txn.
type queryRower interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}
