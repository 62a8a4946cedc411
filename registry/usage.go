package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// DiskUsage is the data a VM's disk held when a host measured it, at a
// generation of the VM's record. A VM that is not running changes its
// disk only through an operation, and every operation writes its record:
// the figure holds until the record changes, for every host of a
// cluster.
type DiskUsage struct {
	VM string
	// Created is the VM's creation: a VM made again under the name starts
	// its generations anew.
	Created    time.Time
	Generation int64
	Data       int64
}

// Holds says whether u is still the figure of vm as recorded now.
func (u DiskUsage) Holds(vm VM) bool {
	return u.Generation == vm.Generation && u.Created.UnixMilli() == vm.CreatedAt.UnixMilli()
}

// UsageStore keeps the disk use measured of VMs, so that no host measures
// what another already did. Figures are advisory: they are written
// unfenced, and a figure of an older generation is never read as one of
// the current.
type UsageStore interface {
	// SetDiskUsage records the figures, each replacing its VM's last;
	// one of a record since changed (or removed) is left out.
	SetDiskUsage(ctx context.Context, us []DiskUsage) error
	// DiskUsages returns every VM's last figure, by VM name.
	DiskUsages(ctx context.Context) (map[string]DiskUsage, error)
}

var _ UsageStore = (*DB)(nil)

// SetDiskUsage implements UsageStore, in one transaction.
func (d *DB) SetDiskUsage(ctx context.Context, us []DiskUsage) error {
	if len(us) == 0 {
		return nil
	}
	tx, err := d.figures.BeginTx(ctx)
	if err != nil {
		return fmt.Errorf("record disk use: %w", err)
	}
	defer tx.Rollback()
	// In the order of the rows' key: two hosts writing the same rows
	// take their locks in one order.
	us = slices.SortedFunc(slices.Values(us), func(a, b DiskUsage) int { return strings.Compare(a.VM, b.VM) })
	for _, u := range us {
		// Only a figure of the record as it is now: one measured at a
		// generation since written over, or of a VM since removed, would
		// never be read.
		if _, err := tx.ExecContext(ctx, `INSERT INTO disk_usage (vm, created, generation, data)
			SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM vms WHERE name = ? AND generation = ? AND created_at = ?)
			ON CONFLICT (vm) DO UPDATE SET created = excluded.created, generation = excluded.generation, data = excluded.data`,
			u.VM, u.Created.UnixMilli(), u.Generation, u.Data, u.VM, u.Generation, u.Created.UnixMilli()); err != nil {
			return fmt.Errorf("record disk use of vm %q: %w", u.VM, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record disk use: %w", err)
	}
	return nil
}

// DiskUsages implements UsageStore.
func (d *DB) DiskUsages(ctx context.Context) (map[string]DiskUsage, error) {
	rows, err := d.figures.QueryContext(ctx, `SELECT vm, created, generation, data FROM disk_usage`+
		` WHERE EXISTS (SELECT 1 FROM vms WHERE name = disk_usage.vm)`)
	if err != nil {
		return nil, fmt.Errorf("read disk use: %w", err)
	}
	defer rows.Close()
	out := map[string]DiskUsage{}
	for rows.Next() {
		var u DiskUsage
		var created int64
		if err := rows.Scan(&u.VM, &created, &u.Generation, &u.Data); err != nil {
			return nil, fmt.Errorf("read disk use: %w", err)
		}
		u.Created = time.UnixMilli(created).UTC()
		out[u.VM] = u
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read disk use: %w", err)
	}
	return out, nil
}
