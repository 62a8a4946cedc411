package registry

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// suspectFor is how long after a connection found its session ended
// (PostgreSQL restarted, failed over, or an administrator ended it) every
// pooled connection is pinged before its next statement: the others
// are most likely dead too.
const suspectFor = 10 * time.Second

// ended is what the connections of one database share: until when they
// are suspect.
type ended struct{ until atomic.Int64 }

func (e *ended) mark() { e.until.Store(time.Now().Add(suspectFor).UnixNano()) }

// endedConnector opens PostgreSQL connections that are sent nothing the
// server may have run twice, yet survive a restart of the server: after
// one, every pooled connection is dead, and the first use of each would
// fail. A connection is pinged before reuse when it was idle over a
// second (pgx's own rule) or while its pool is suspect; a BEGIN, a read
// and a statement nothing of which reached the server are sent again on
// another connection (database/sql does so on driver.ErrBadConn).
type endedConnector struct {
	driver.Connector
	e *ended
}

func newEndedConnector(cfg pgx.ConnConfig, e *ended) endedConnector {
	ping := stdlib.OptionShouldPing(func(_ context.Context, p stdlib.ShouldPingParams) bool {
		return p.IdleDuration > time.Second || time.Now().UnixNano() < e.until.Load()
	})
	return endedConnector{Connector: stdlib.GetConnector(cfg, ping), e: e}
}

func (c endedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return dc, nil
	}
	return endedConn{sc, c.e}, nil
}

// endedConn is a pgx connection that reports a session the server ended
// as driver.ErrBadConn where sending again is safe: a BEGIN, and a query
// outside a transaction (den's queries outside transactions are reads,
// and one UPDATE ... RETURNING that renews leases, which may run twice).
// A statement (ExecContext) is sent again only when none of it was
// written: PostgreSQL may end a session after it committed a statement
// (a synchronous standby that did not answer), and an INSERT or a DELETE
// run twice answers wrong.
type endedConn struct {
	*stdlib.Conn
	e *ended
}

func (c endedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	return tx, c.bad(ctx, err, true)
}

func (c endedConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	inTx := c.Conn.Conn().PgConn().TxStatus() != 'I'
	rows, err := c.Conn.QueryContext(ctx, q, args)
	return rows, c.bad(ctx, err, !inTx)
}

func (c endedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.ExecContext(ctx, q, args)
	return res, c.bad(ctx, err, false)
}

// bad is driver.ErrBadConn for an error database/sql may recover from on
// another connection: one that wrote nothing of the statement (the
// server had closed the connection), and, where ended is allowed, the
// server's word that it ended the session (SQLSTATE class 57P:
// administrator or crash shutdown, or not accepting yet). Either marks
// the pool suspect.
func (c endedConn) bad(ctx context.Context, err error, ended bool) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	var pe *pgconn.PgError
	isEnded := errors.As(err, &pe) && (pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03")
	unsent := pgconn.SafeToRetry(err) || errors.Is(err, syscall.EPIPE)
	if isEnded || unsent {
		c.e.mark()
	}
	if unsent || isEnded && ended {
		return driver.ErrBadConn
	}
	return err
}
