package registry

import (
	"context"
	"database/sql/driver"
	"errors"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// endedConnector opens PostgreSQL connections whose statements report a
// session the server has ended (a restart, a failover, an administrator)
// as a bad connection, so that database/sql sends the statement again on
// another connection instead of failing it: after a restart every pooled
// connection is dead, and the first use of each would otherwise fail.
type endedConnector struct{ driver.Connector }

func newEndedConnector(cfg pgx.ConnConfig) endedConnector {
	return endedConnector{stdlib.GetConnector(cfg)}
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
	return endedConn{sc}, nil
}

// endedConn is a pgx connection that turns "the server ended this
// session" into driver.ErrBadConn where sending again is safe: a BEGIN,
// and a statement outside a transaction (the server aborts what it ran
// when it ends a session, so nothing of it was committed). Statements
// inside a transaction are not sent again: database/sql never does.
type endedConn struct{ *stdlib.Conn }

func (c endedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	return tx, badIfEnded(err)
}

func (c endedConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	inTx := c.Conn.Conn().PgConn().TxStatus() != 'I'
	rows, err := c.Conn.QueryContext(ctx, q, args)
	if inTx {
		return rows, err
	}
	return rows, badIfEnded(err)
}

func (c endedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	inTx := c.Conn.Conn().PgConn().TxStatus() != 'I'
	res, err := c.Conn.ExecContext(ctx, q, args)
	if inTx {
		return res, err
	}
	return res, badIfEnded(err)
}

// badIfEnded is driver.ErrBadConn for the errors of a session the server
// ended: administrator or crash shutdown, or a server not yet accepting
// (SQLSTATE class 57P), a statement that could not be written (the server
// closed the connection before it: nothing of it reached the server).
func badIfEnded(err error) error {
	if err == nil {
		return nil
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, syscall.EPIPE) {
		return driver.ErrBadConn
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03":
			return driver.ErrBadConn
		}
	}
	return err
}
