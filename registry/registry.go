// Package registry keeps den's durable record of its VMs: in a local
// SQLite database (pure Go, so den stays a static binary) on one host, or
// in PostgreSQL shared by the hosts of a cluster.
package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

var (
	// ErrNotFound is wrapped when a VM does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists is wrapped when a VM name is taken.
	ErrExists = errors.New("already exists")
	// ErrStale is wrapped when a compare-and-set update finds the record
	// changed since the generation it was decided on.
	ErrStale = errors.New("record changed meanwhile")
)

// DB is den's state database, SQLite or PostgreSQL.
type DB struct {
	db *conn // the record: VMs, checkpoints, keys, tokens (fenced in a cluster)
	// meta is the hosts' records and leases, never fenced: a host renews
	// its lease, and records its heartbeat, through it.
	meta *conn
	// figures is the record's connections unfenced, for what is only
	// advisory (disk use measured).
	figures *conn
	// ended is what a PostgreSQL registry's connections share (nil on
	// SQLite).
	ended *ended
}

func newDB(db *sql.DB, d dialect) *DB {
	return &DB{db: &conn{db: db, d: d, fence: &atomic.Pointer[Lease]{}}, meta: &conn{db: db, d: d}, figures: &conn{db: db, d: d}}
}

// Fence makes every later write of the record (VMs, checkpoints, keys,
// tokens) commit only while l is held by its host at its generation: a
// host of a cluster that lost its lease cannot write over what the host
// that took over wrote.
func (d *DB) Fence(l Lease) { d.db.fence.Store(&l) }

// sqliteSchema is applied in order; PRAGMA user_version records how far.
var sqliteSchema = []string{
	`CREATE TABLE vms (
		name         TEXT PRIMARY KEY,
		owner        TEXT NOT NULL,
		image        TEXT NOT NULL,
		cpus         INTEGER NOT NULL,
		memory_bytes INTEGER NOT NULL,
		disk_bytes   INTEGER NOT NULL,
		state        TEXT NOT NULL,
		reason       TEXT NOT NULL DEFAULT '',
		vmm          TEXT NOT NULL DEFAULT '',
		accel        TEXT NOT NULL DEFAULT '',
		idle_timeout_ms INTEGER NOT NULL DEFAULT 0,
		created_at   INTEGER NOT NULL,
		last_active  INTEGER NOT NULL,
		spec_json    TEXT NOT NULL DEFAULT '{}'
	)`,
	`CREATE TABLE checkpoints (
		vm          TEXT NOT NULL,
		id          TEXT NOT NULL,
		seq         INTEGER NOT NULL,
		parent      TEXT NOT NULL DEFAULT '',
		kind        TEXT NOT NULL,
		comment     TEXT NOT NULL DEFAULT '',
		created_at  INTEGER NOT NULL,
		memory_bytes INTEGER NOT NULL DEFAULT 0,
		disk_bytes  INTEGER NOT NULL DEFAULT 0,
		vmm         TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (vm, id)
	)`,
	`CREATE TABLE keys (
		fingerprint TEXT PRIMARY KEY,
		user        TEXT NOT NULL,
		name        TEXT NOT NULL DEFAULT '',
		public_key  TEXT NOT NULL,
		created_at  INTEGER NOT NULL
	)`,
	// generation counts every write of a VM's record: compare-and-set
	// updates carry the generation their decision was based on.
	`ALTER TABLE vms ADD COLUMN generation INTEGER NOT NULL DEFAULT 0`,
	// wake_on_boot marks a VM put to sleep for a host shutdown: the next
	// daemon start wakes it (VM.WakeOnBoot).
	`ALTER TABLE vms ADD COLUMN wake_on_boot INTEGER NOT NULL DEFAULT 0`,
	// seal names a checkpoint's digests (checkpoint.Record.Seal): a
	// checkpoint recorded with one is damaged without them.
	`ALTER TABLE checkpoints ADD COLUMN seal TEXT NOT NULL DEFAULT ''`,
	// tokens are the API's bearer tokens (Token): only the secret's hash
	// is kept. A name is unique per user; last_used 0 is never.
	`CREATE TABLE tokens (
		id          TEXT PRIMARY KEY,
		user        TEXT NOT NULL,
		name        TEXT NOT NULL,
		admin       INTEGER NOT NULL DEFAULT 0,
		hash        TEXT NOT NULL UNIQUE,
		created_at  INTEGER NOT NULL,
		last_used   INTEGER NOT NULL DEFAULT 0,
		UNIQUE (user, name)
	)`,
	// checkpoint_seqs is, per VM name, the highest checkpoint sequence
	// number ever recorded: a checkpoint id is never handed out twice
	// for a name, whatever was deleted since (the newest checkpoint, or
	// the VM and every checkpoint with it). Existing databases start
	// from the rows they have.
	`CREATE TABLE checkpoint_seqs (
		vm   TEXT PRIMARY KEY,
		last INTEGER NOT NULL
	)`,
	`INSERT INTO checkpoint_seqs (vm, last) SELECT vm, MAX(seq) FROM checkpoints GROUP BY vm`,
	// hosts are the daemons sharing this record (HostStore).
	`CREATE TABLE hosts (
		name          TEXT PRIMARY KEY,
		address       TEXT NOT NULL DEFAULT '',
		version       TEXT NOT NULL DEFAULT '',
		vmm           TEXT NOT NULL DEFAULT '',
		cpu_model     TEXT NOT NULL DEFAULT '',
		cpus          INTEGER NOT NULL DEFAULT 0,
		memory_budget INTEGER NOT NULL DEFAULT 0,
		memory_free   INTEGER NOT NULL DEFAULT 0,
		running       INTEGER NOT NULL DEFAULT 0,
		sleeping      INTEGER NOT NULL DEFAULT 0,
		draining      INTEGER NOT NULL DEFAULT 0,
		started_at    INTEGER NOT NULL DEFAULT 0,
		heartbeat_at  INTEGER NOT NULL DEFAULT 0
	)`,
	// leases say which host may run a VM, until when, at which
	// generation (LeaseStore); rows outlive their VMs.
	`CREATE TABLE leases (
		vm         TEXT PRIMARY KEY,
		host       TEXT NOT NULL DEFAULT '',
		instance   TEXT NOT NULL DEFAULT '',
		generation INTEGER NOT NULL DEFAULT 0,
		expires_at INTEGER NOT NULL DEFAULT 0
	)`,
	// compat is what a host's VMMs and CPU restore (Host.Compat).
	`ALTER TABLE hosts ADD COLUMN compat TEXT NOT NULL DEFAULT ''`,
	// disk_usage is each VM's disk use as last measured (UsageStore).
	`CREATE TABLE disk_usage (
		vm         TEXT PRIMARY KEY,
		created    INTEGER NOT NULL,
		generation INTEGER NOT NULL,
		data       INTEGER NOT NULL
	)`,
}

// Open opens (creating if needed) the SQLite database at path and brings
// its schema up to date.
func Open(path string) (*DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open state db: %w", err)
	}
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open state db %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serialises anyway
	d := newDB(db, sqliteDialect)
	if err := d.migrateSQLite(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state db %s: %w", path, err)
	}
	return d, nil
}

func (d *DB) migrateSQLite() error {
	var v int
	if err := d.db.db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		return err
	}
	if v > len(sqliteSchema) {
		return fmt.Errorf("schema version %d is newer than this den knows (%d): run a newer den", v, len(sqliteSchema))
	}
	for i := v; i < len(sqliteSchema); i++ {
		tx, err := d.db.db.Begin()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(sqliteSchema[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("schema step %d: %w", i+1, err)
		}
		if _, err := tx.Exec(fmt.Sprintf("PRAGMA user_version = %d", i+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Backend names the database den keeps its record in: sqlite or
// postgres.
func (d *DB) Backend() string { return d.db.d.name }

// Close closes the database.
func (d *DB) Close() error {
	err := d.db.db.Close()
	if d.meta.db != d.db.db {
		err = errors.Join(err, d.meta.db.Close())
	}
	return err
}

const vmColumns = `name, owner, image, cpus, memory_bytes, disk_bytes, state, reason, vmm, accel, idle_timeout_ms, created_at, last_active, spec_json, generation, wake_on_boot`

type scanner interface{ Scan(...any) error }

func scanVM(s scanner) (VM, error) {
	var vm VM
	var idle, created, active int64
	var state string
	err := s.Scan(&vm.Name, &vm.Owner, &vm.Image, &vm.CPUs, &vm.MemoryBytes, &vm.DiskBytes, &state, &vm.Reason,
		&vm.VMM, &vm.Accel, &idle, &created, &active, &vm.SpecJSON, &vm.Generation, &vm.WakeOnBoot)
	vm.State = State(state)
	vm.IdleTimeout = time.Duration(idle) * time.Millisecond
	vm.CreatedAt = time.UnixMilli(created).UTC()
	vm.LastActive = time.UnixMilli(active).UTC()
	return vm, err
}

// CreateVM records a new VM; ErrExists when the name is taken.
func (d *DB) CreateVM(ctx context.Context, vm VM) error {
	if err := checkVM(vm); err != nil {
		return err
	}
	_, err := d.db.ExecContext(ctx, `INSERT INTO vms (`+vmColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,1,?)`,
		vm.Name, vm.Owner, vm.Image, vm.CPUs, vm.MemoryBytes, vm.DiskBytes, string(vm.State), vm.Reason,
		vm.VMM, vm.Accel, vm.IdleTimeout.Milliseconds(), vm.CreatedAt.UnixMilli(), vm.LastActive.UnixMilli(), specOrEmpty(vm.SpecJSON),
		vm.WakeOnBoot)
	if err != nil {
		if _, ok := d.db.d.unique(err); ok {
			return fmt.Errorf("vm %q: %w", vm.Name, ErrExists)
		}
		return fmt.Errorf("record vm %q: %w", vm.Name, err)
	}
	return nil
}

func specOrEmpty(s string) string {
	if s == "" {
		return "{}"
	}
	return s
}

// GetVM returns a VM; ErrNotFound when there is none of that name.
func (d *DB) GetVM(ctx context.Context, name string) (VM, error) {
	vm, err := scanVM(d.db.QueryRowContext(ctx, `SELECT `+vmColumns+` FROM vms WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return VM{}, fmt.Errorf("vm %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return VM{}, fmt.Errorf("read vm %q: %w", name, err)
	}
	return vm, nil
}

// ListVMs returns the VMs ordered by name; of one owner when owner is set.
func (d *DB) ListVMs(ctx context.Context, owner string) ([]VM, error) {
	q := `SELECT ` + vmColumns + ` FROM vms`
	var args []any
	if owner != "" {
		q += ` WHERE owner = ?`
		args = append(args, owner)
	}
	rows, err := d.db.QueryContext(ctx, q+` ORDER BY name`, args...)
	if err != nil {
		return nil, fmt.Errorf("list vms: %w", err)
	}
	defer rows.Close()
	var vms []VM
	for rows.Next() {
		vm, err := scanVM(rows)
		if err != nil {
			return nil, fmt.Errorf("list vms: %w", err)
		}
		vms = append(vms, vm)
	}
	return vms, rows.Err()
}

// UpdateVM reads a VM, lets f change it, checks the state transition, and
// writes it back in one transaction, with the next generation.
func (d *DB) UpdateVM(ctx context.Context, name string, f func(*VM) error) (VM, error) {
	return d.update(ctx, name, -1, f)
}

// UpdateVMIf is UpdateVM as a compare-and-set: it writes only if the
// record is still at generation gen, and wraps ErrStale otherwise.
func (d *DB) UpdateVMIf(ctx context.Context, name string, gen int64, f func(*VM) error) (VM, error) {
	return d.update(ctx, name, gen, f)
}

func (d *DB) update(ctx context.Context, name string, gen int64, f func(*VM) error) (VM, error) {
	tx, err := d.db.BeginTx(ctx)
	if err != nil {
		return VM{}, fmt.Errorf("update vm %q: %w", name, err)
	}
	defer tx.Rollback()
	vm, err := scanVM(tx.QueryRowContext(ctx, `SELECT `+vmColumns+` FROM vms WHERE name = ?`+d.db.d.forUpdate, name))
	if errors.Is(err, sql.ErrNoRows) {
		return VM{}, fmt.Errorf("vm %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return VM{}, fmt.Errorf("update vm %q: %w", name, err)
	}
	if gen >= 0 && vm.Generation != gen {
		return VM{}, fmt.Errorf("vm %q is at generation %d (%s), not %d: %w", name, vm.Generation, vm.State, gen, ErrStale)
	}
	old, oldGen := vm.State, vm.Generation
	read := vm
	if err := f(&vm); err != nil {
		return VM{}, err
	}
	if vm.State != old {
		if err := CheckTransition(old, vm.State); err != nil {
			return VM{}, fmt.Errorf("vm %q: %w", name, err)
		}
	}
	vm.KeepWakeOnBoot(old)
	if vm.Owner != read.Owner || vm.Image != read.Image {
		if err := checkVM(vm); err != nil {
			return VM{}, err
		}
	}
	vm.Name, vm.Generation = name, oldGen+1
	res, err := tx.ExecContext(ctx, `UPDATE vms SET owner=?, image=?, cpus=?, memory_bytes=?, disk_bytes=?, state=?, reason=?, vmm=?, accel=?,
		idle_timeout_ms=?, created_at=?, last_active=?, spec_json=?, generation=?, wake_on_boot=? WHERE name=? AND generation=?`,
		vm.Owner, vm.Image, vm.CPUs, vm.MemoryBytes, vm.DiskBytes, string(vm.State), vm.Reason, vm.VMM, vm.Accel,
		vm.IdleTimeout.Milliseconds(), vm.CreatedAt.UnixMilli(), vm.LastActive.UnixMilli(), specOrEmpty(vm.SpecJSON),
		vm.Generation, vm.WakeOnBoot, name, oldGen)
	if err != nil {
		return VM{}, fmt.Errorf("update vm %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return VM{}, fmt.Errorf("vm %q changed during the update: %w", name, ErrStale)
	}
	if err := tx.Commit(); err != nil {
		return VM{}, fmt.Errorf("update vm %q: %w", name, err)
	}
	return vm, nil
}

// DeleteVM removes a VM's record, with its disk use's.
func (d *DB) DeleteVM(ctx context.Context, name string) error {
	tx, err := d.db.BeginTx(ctx)
	if err != nil {
		return fmt.Errorf("delete vm %q: %w", name, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM vms WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("delete vm %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("vm %q: %w", name, ErrNotFound)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM disk_usage WHERE vm = ?`, name); err != nil {
		return fmt.Errorf("delete vm %q: %w", name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete vm %q: %w", name, err)
	}
	return nil
}
