package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// dialect is what differs between the SQL of den's two backends. Queries
// are written once, with ? placeholders and quoted identifiers; the
// dialect rewrites what it must.
type dialect struct {
	name string
	// numbered: placeholders are $1, $2, ... (PostgreSQL), not ?.
	numbered bool
	// forUpdate and forShare lock the rows a SELECT reads until the
	// transaction ends (PostgreSQL; SQLite has one writer at a time
	// anyway).
	forUpdate, forShare string
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
	forShare:  " FOR SHARE",
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

// conn is the database in one dialect. A fenced conn (fence set and
// holding a lease) commits a write only while that lease is held: its
// host's, at its generation, unexpired by the database's clock.
type conn struct {
	db    *sql.DB
	d     dialect
	fence *atomic.Pointer[Lease]
}

func (c *conn) fenced() *Lease {
	if c.fence == nil {
		return nil
	}
	return c.fence.Load()
}

func (c *conn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if c.fenced() == nil {
		return c.db.ExecContext(ctx, c.d.rebind(q), args...)
	}
	tx, err := c.BeginTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return res, tx.Commit()
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
	return &txn{tx: tx, d: c.d, ctx: ctx, fence: c.fenced()}, nil
}

// txn is a transaction in one dialect; with a fence, Commit checks it.
type txn struct {
	tx    *sql.Tx
	d     dialect
	ctx   context.Context
	fence *Lease
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

// Commit commits; a fenced transaction only while its lease is held,
// which it holds shared until the commit: a takeover (AcquireLease locks
// the row for update) waits for it, so a write that passed the check is
// in before the lease changes hands.
func (t *txn) Commit() error {
	if l := t.fence; l != nil {
		var gen int64
		err := t.QueryRowContext(t.ctx, `SELECT generation FROM leases WHERE vm = ? AND host = ? AND instance = ? AND generation = ? AND expires_at > `+
			t.d.now+t.d.forShare, l.VM, l.Host, l.Instance, l.Generation).Scan(&gen)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("host %q's lease %q of generation %d is no longer held: the write is refused: %w", l.Host, l.VM, l.Generation, ErrLeaseLost)
		}
		if err != nil {
			return err
		}
	}
	return t.tx.Commit()
}
func (t *txn) Rollback() error { return t.tx.Rollback() }

// queryRower is a conn or a txn.
type queryRower interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}
