package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/denhq/den/checkpoint"
)

// Checkpoint is one checkpoint's catalog row: the record the checkpoint
// package writes beside its files.
type Checkpoint = checkpoint.Record

const cpColumns = `vm, id, seq, parent, kind, comment, created_at, memory_bytes, disk_bytes, vmm, seal`

func scanCheckpoint(s scanner) (Checkpoint, error) {
	var c Checkpoint
	var created int64
	err := s.Scan(&c.VM, &c.ID, &c.Seq, &c.Parent, &c.Kind, &c.Comment, &created, &c.MemoryBytes, &c.DiskBytes, &c.VMM, &c.Seal)
	c.CreatedAt = time.UnixMilli(created).UTC()
	return c, err
}

// NextCheckpointSeq is one more than the highest sequence number a
// checkpoint of a VM of that name ever had: ids are never reused, after
// the deletion of checkpoints or of the VM either.
func (d *DB) NextCheckpointSeq(ctx context.Context, vm string) (int, error) {
	last, err := lastCheckpointSeq(ctx, d.db, vm)
	if err != nil {
		return 0, fmt.Errorf("next checkpoint of %q: %w", vm, err)
	}
	return last + 1, nil
}

// lastCheckpointSeq is the highest sequence number a checkpoint of vm
// was recorded with (0: none ever was).
func lastCheckpointSeq(ctx context.Context, q queryRower, vm string) (int, error) {
	var recorded, held int
	err := q.QueryRowContext(ctx, `SELECT
		COALESCE((SELECT last FROM checkpoint_seqs WHERE vm = ?), 0),
		COALESCE((SELECT MAX(seq) FROM checkpoints WHERE vm = ?), 0)`, vm, vm).Scan(&recorded, &held)
	return max(recorded, held), err
}

// AddCheckpoint records a checkpoint, and its sequence number as its VM
// name's highest: ErrExists when a checkpoint of that name had the
// number (or a higher one) before, even one deleted since.
func (d *DB) AddCheckpoint(ctx context.Context, c Checkpoint) error {
	if err := checkCheckpoint(c); err != nil {
		return err
	}
	tx, err := d.db.BeginTx(ctx)
	if err != nil {
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	defer tx.Rollback()
	if err := tx.Lock(ctx, "den.checkpoints."+c.VM); err != nil {
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	last, err := lastCheckpointSeq(ctx, tx, c.VM)
	if err != nil {
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	if c.Seq <= last {
		return fmt.Errorf("checkpoint %s of %q: sequence number %d was handed out before (the last is %d): %w", c.ID, c.VM, c.Seq, last, ErrExists)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO checkpoints (`+cpColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?)`,
		c.VM, c.ID, c.Seq, c.Parent, c.Kind, c.Comment, c.CreatedAt.UnixMilli(), c.MemoryBytes, c.DiskBytes, c.VMM, c.Seal)
	if err != nil {
		if _, ok := d.db.d.unique(err); ok {
			return fmt.Errorf("checkpoint %s of %q: %w", c.ID, c.VM, ErrExists)
		}
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO checkpoint_seqs (vm, last) VALUES (?, ?)
		ON CONFLICT (vm) DO UPDATE SET last = excluded.last`, c.VM, c.Seq); err != nil {
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	return nil
}

// SetCheckpointSizes records the data sizes of a checkpoint's memory and
// disk, read after it was taken; a checkpoint deleted meanwhile is left
// alone.
func (d *DB) SetCheckpointSizes(ctx context.Context, vm, id string, memory, disk int64) error {
	if _, err := d.db.ExecContext(ctx, `UPDATE checkpoints SET memory_bytes = ?, disk_bytes = ? WHERE vm = ? AND id = ?`, memory, disk, vm, id); err != nil {
		return fmt.Errorf("sizes of checkpoint %s of %q: %w", id, vm, err)
	}
	return nil
}

// GetCheckpoint returns one checkpoint; ErrNotFound when there is none.
func (d *DB) GetCheckpoint(ctx context.Context, vm, id string) (Checkpoint, error) {
	c, err := scanCheckpoint(d.db.QueryRowContext(ctx, `SELECT `+cpColumns+` FROM checkpoints WHERE vm = ? AND id = ?`, vm, id))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("checkpoint %q of vm %q: %w", id, vm, ErrNotFound)
	}
	return c, err
}

// ListCheckpoints returns a VM's checkpoints, oldest first.
func (d *DB) ListCheckpoints(ctx context.Context, vm string) ([]Checkpoint, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT `+cpColumns+` FROM checkpoints WHERE vm = ? ORDER BY seq`, vm)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of %q: %w", vm, err)
	}
	defer rows.Close()
	var out []Checkpoint
	for rows.Next() {
		c, err := scanCheckpoint(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// DeleteCheckpoint removes a checkpoint's row; its children take its
// parent, so the lineage stays connected. Its id is not handed out again.
func (d *DB) DeleteCheckpoint(ctx context.Context, vm, id string) error {
	tx, err := d.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tx.Lock(ctx, "den.checkpoints."+vm); err != nil {
		return err
	}
	c, err := scanCheckpoint(tx.QueryRowContext(ctx, `SELECT `+cpColumns+` FROM checkpoints WHERE vm = ? AND id = ?`, vm, id))
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("checkpoint %q of vm %q: %w", id, vm, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE checkpoints SET parent = ? WHERE vm = ? AND parent = ?`, c.Parent, vm, id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM checkpoints WHERE vm = ? AND id = ?`, vm, id); err != nil {
		return err
	}
	return tx.Commit()
}

// DeleteCheckpoints removes every checkpoint row of a VM (its name's
// highest sequence number is kept: a new VM of that name goes on from
// it).
func (d *DB) DeleteCheckpoints(ctx context.Context, vm string) error {
	_, err := d.db.ExecContext(ctx, `DELETE FROM checkpoints WHERE vm = ?`, vm)
	return err
}
