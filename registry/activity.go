package registry

import (
	"context"
	"fmt"
	"time"
)

// TouchVM raises a VM's last activity to t (never lowers it). It is
// advisory, not a transition: it leaves the state and the generation
// alone, so that it never makes an operation's compare-and-set stale (an
// update reads the record in its transaction, so it keeps what TouchVM
// wrote unless it sets the field itself). ErrNotFound when there is no
// such VM.
func (d *DB) TouchVM(ctx context.Context, name string, t time.Time) error {
	res, err := d.db.ExecContext(ctx, `UPDATE vms SET last_active = CASE WHEN last_active > ? THEN last_active ELSE ? END WHERE name = ?`, t.UnixMilli(), t.UnixMilli(), name)
	if err != nil {
		return fmt.Errorf("record last activity of vm %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("vm %q: %w", name, ErrNotFound)
	}
	return nil
}
