package registry

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
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

// restartPatience is how long a new connection waits for a server that
// refuses it, or says it is starting up or shutting down: about what a
// restart or a failover takes, not what an outage does. An operation
// that meets a restart finishes once it is over.
const restartPatience = 10 * time.Second

// ended is what the connections of one database share: until when they
// are suspect, and how many connections the server has refused (down
// or restarting).
type ended struct{ until, refused atomic.Int64 }

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
	dc, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return dc, nil
	}
	return endedConn{sc, c.e}, nil
}

// connect connects, waiting (restartPatience at most) while the server
// is down or restarting.
func (c endedConnector) connect(ctx context.Context) (driver.Conn, error) {
	start := time.Now()
	wait := 50 * time.Millisecond
	for {
		dc, err := c.Connector.Connect(ctx)
		if err == nil || !serverAway(err) || ctx.Err() != nil {
			return dc, err
		}
		c.e.mark()
		c.e.refused.Add(1)
		if time.Since(start)+wait > restartPatience {
			return nil, fmt.Errorf("postgresql took no connection within %s: %w", restartPatience, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for postgresql to take a connection: %w", errors.Join(ctx.Err(), err))
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// serverAway says err is of a server that is down or restarting: the
// connection was refused, or ended before it was set up, or the server
// said it is starting up or shutting down (SQLSTATE class 57P).
func serverAway(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return endedCode(pe.Code)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Net == "unix" && errors.Is(err, syscall.ENOENT) {
		return true // its socket file is gone while it is down
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// endedCode: administrator or crash shutdown, or not accepting yet.
func endedCode(code string) bool { return code == "57P01" || code == "57P02" || code == "57P03" }

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
	if err != nil && !inTx && ctx.Err() == nil && c.lost(err) {
		// A query outside a transaction may run twice: sent again on
		// another connection however far it got on this one.
		c.e.mark()
		return nil, driver.ErrBadConn
	}
	return rows, c.bad(ctx, err, !inTx)
}

// lost says the connection ended with err: it broke (pgx closes a
// connection whose network failed), or the server ended the session.
func (c endedConn) lost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return endedCode(pe.Code)
	}
	return c.Conn.Conn().IsClosed()
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
	isEnded := errors.As(err, &pe) && endedCode(pe.Code)
	unsent := pgconn.SafeToRetry(err) || errors.Is(err, syscall.EPIPE)
	if isEnded || unsent {
		c.e.mark()
	}
	if unsent || isEnded && ended {
		return driver.ErrBadConn
	}
	return err
}
