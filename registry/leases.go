package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

var (
	// ErrLeased is wrapped when another host holds a VM's lease.
	ErrLeased = errors.New("held by another host")
	// ErrLeaseLost is wrapped when a host renews or releases a lease it
	// no longer holds: it expired, or another host took the VM over.
	ErrLeaseLost = errors.New("lease lost")
)

// Lease is a host's right to run a VM until Expires, by the database's
// clock. Generation grows every time the lease changes hands (or is taken
// again after it lapsed): it is the fencing token that a host's writes
// carry, so that a host which lost the lease cannot write over newer
// state. A VM's lease row outlives the VM, so a VM made again under the
// same name goes on from the generation the old one reached.
type Lease struct {
	VM   string `json:"vm"`
	Host string `json:"host"` // "" : nobody holds it
	// Instance tells apart daemons that give the same host name: the
	// holder's random id, kept in its state dir.
	Instance   string    `json:"instance"`
	Generation int64     `json:"generation"`
	Expires    time.Time `json:"expires"`
	// Now is the database's clock when the lease was read or written.
	Now time.Time `json:"now"`
	// TakenFrom, set by AcquireLease only, is the host whose lapsed
	// lease this one took over ("" when the lease was free, or this
	// daemon's own).
	TakenFrom string `json:"taken_from,omitempty"`
}

// Held reports whether the lease is held at its Now.
func (l Lease) Held() bool { return l.Host != "" && l.Now.Before(l.Expires) }

// LeaseStore keeps the VMs' leases.
type LeaseStore interface {
	// AcquireLease gives the daemon instance of host the VM's lease for
	// ttl: when nobody holds it, when that daemon holds it already (same
	// generation), or when the holder's lease expired at least grace ago
	// (a new generation). It wraps ErrLeased otherwise, for another
	// daemon of the same host name too.
	AcquireLease(ctx context.Context, vm, host, instance string, ttl, grace time.Duration) (Lease, error)
	// RenewLeases extends every unexpired lease the daemon instance of
	// host holds to ttl from now and returns them; a lease that expired
	// meanwhile is not renewed (its host must have stopped the VM by
	// then).
	RenewLeases(ctx context.Context, host, instance string, ttl time.Duration) ([]Lease, error)
	// ReleaseLease gives up l; ErrLeaseLost when l is no longer held as
	// it was (by its host and instance, at its generation).
	ReleaseLease(ctx context.Context, l Lease) error
	// GetLease returns the VM's lease (Host "" when none was ever
	// taken).
	GetLease(ctx context.Context, vm string) (Lease, error)
	// ExpiredLeases returns the leases whose holder let them expire at
	// least grace ago: VMs whose host is presumed dead.
	ExpiredLeases(ctx context.Context, grace time.Duration) ([]Lease, error)
	// HostLeases returns the leases that name host, held or let lapse,
	// ordered by VM.
	HostLeases(ctx context.Context, host string) ([]Lease, error)
}

var _ LeaseStore = (*DB)(nil)

const leaseColumns = `vm, host, instance, generation, expires_at`

func scanLease(s scanner) (Lease, error) {
	var l Lease
	var exp int64
	err := s.Scan(&l.VM, &l.Host, &l.Instance, &l.Generation, &exp)
	l.Expires = time.UnixMilli(exp).UTC()
	return l, err
}

func (d *DB) dbNow(ctx context.Context, q queryRower) (int64, error) {
	var now int64
	err := q.QueryRowContext(ctx, `SELECT `+d.meta.d.now).Scan(&now)
	return now, err
}

// AcquireLease implements LeaseStore.
func (d *DB) AcquireLease(ctx context.Context, vm, host, instance string, ttl, grace time.Duration) (Lease, error) {
	if err := checkHostName(host); err != nil {
		return Lease{}, err
	}
	tx, err := d.meta.BeginTx(ctx)
	if err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO leases (vm) VALUES (?) ON CONFLICT (vm) DO NOTHING`, vm); err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	l, err := scanLease(tx.QueryRowContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE vm = ?`+d.meta.d.forUpdate, vm))
	if err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	now, err := d.dbNow(ctx, tx)
	if err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	exp := l.Expires.UnixMilli()
	mine := l.Host == host && l.Instance == instance
	switch {
	case mine && now < exp:
		// Held by this daemon already: the same generation, extended.
	case l.Host == "" || (mine && now >= exp) || now >= exp+grace.Milliseconds():
		if l.Host != "" && !mine {
			l.TakenFrom = l.Host
		}
		l.Generation++
	case l.Host == host:
		return Lease{}, fmt.Errorf("lease %q is %w: another daemon named %q (instance %s) holds it until %s: give each host a name of its own",
			vm, ErrLeased, host, l.Instance, l.Expires.Format(time.RFC3339))
	default:
		return Lease{}, fmt.Errorf("lease %q is %w %q until %s (%s from now, with the grace)", vm, ErrLeased, l.Host,
			l.Expires.Format(time.RFC3339), time.Duration(exp+grace.Milliseconds()-now)*time.Millisecond)
	}
	l.Host, l.Instance, l.Expires, l.Now = host, instance, time.UnixMilli(now+ttl.Milliseconds()).UTC(), time.UnixMilli(now).UTC()
	if _, err := tx.ExecContext(ctx, `UPDATE leases SET host = ?, instance = ?, generation = ?, expires_at = ? WHERE vm = ?`,
		host, instance, l.Generation, l.Expires.UnixMilli(), vm); err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	if err := tx.Commit(); err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	return l, nil
}

// RenewLeases implements LeaseStore.
func (d *DB) RenewLeases(ctx context.Context, host, instance string, ttl time.Duration) ([]Lease, error) {
	now := d.meta.d.now
	rows, err := d.meta.QueryContext(ctx, `UPDATE leases SET expires_at = `+now+` + ? WHERE host = ? AND instance = ? AND expires_at > `+now+`
		RETURNING `+leaseColumns+`, `+now, ttl.Milliseconds(), host, instance)
	if err != nil {
		return nil, fmt.Errorf("renew leases of host %q: %w", host, err)
	}
	out, err := collect(rows, func(s scanner) (Lease, error) {
		var l Lease
		var exp, at int64
		err := s.Scan(&l.VM, &l.Host, &l.Instance, &l.Generation, &exp, &at)
		l.Expires, l.Now = time.UnixMilli(exp).UTC(), time.UnixMilli(at).UTC()
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("renew leases of host %q: %w", host, err)
	}
	return out, nil
}

// ReleaseLease implements LeaseStore.
func (d *DB) ReleaseLease(ctx context.Context, l Lease) error {
	res, err := d.meta.ExecContext(ctx, `UPDATE leases SET host = '', instance = '', expires_at = 0 WHERE vm = ? AND host = ? AND instance = ? AND generation = ?`,
		l.VM, l.Host, l.Instance, l.Generation)
	if err != nil {
		return fmt.Errorf("release lease of vm %q: %w", l.VM, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("release lease of vm %q (host %q, generation %d): %w", l.VM, l.Host, l.Generation, ErrLeaseLost)
	}
	return nil
}

// GetLease implements LeaseStore.
func (d *DB) GetLease(ctx context.Context, vm string) (Lease, error) {
	now, err := d.dbNow(ctx, d.db)
	if err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	l, err := scanLease(d.meta.QueryRowContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE vm = ?`, vm))
	if errors.Is(err, sql.ErrNoRows) {
		l, err = Lease{VM: vm}, nil
	}
	if err != nil {
		return Lease{}, fmt.Errorf("lease of vm %q: %w", vm, err)
	}
	l.Now = time.UnixMilli(now).UTC()
	return l, nil
}

// ExpiredLeases implements LeaseStore.
func (d *DB) ExpiredLeases(ctx context.Context, grace time.Duration) ([]Lease, error) {
	now, err := d.dbNow(ctx, d.db)
	if err != nil {
		return nil, fmt.Errorf("expired leases: %w", err)
	}
	rows, err := d.meta.QueryContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE host <> '' AND expires_at + ? <= ? ORDER BY vm`,
		grace.Milliseconds(), now)
	if err != nil {
		return nil, fmt.Errorf("expired leases: %w", err)
	}
	out, err := collect(rows, scanLease)
	if err != nil {
		return nil, fmt.Errorf("expired leases: %w", err)
	}
	for i := range out {
		out[i].Now = time.UnixMilli(now).UTC()
	}
	return out, nil
}

// HostLeases implements LeaseStore.
func (d *DB) HostLeases(ctx context.Context, host string) ([]Lease, error) {
	now, err := d.dbNow(ctx, d.meta)
	if err != nil {
		return nil, fmt.Errorf("leases of host %q: %w", host, err)
	}
	rows, err := d.meta.QueryContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE host = ? ORDER BY vm`, host)
	if err != nil {
		return nil, fmt.Errorf("leases of host %q: %w", host, err)
	}
	out, err := collect(rows, scanLease)
	if err != nil {
		return nil, fmt.Errorf("leases of host %q: %w", host, err)
	}
	for i := range out {
		out[i].Now = time.UnixMilli(now).UTC()
	}
	return out, nil
}
