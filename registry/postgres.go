package registry

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgresSchema is applied in order; den_schema records how far. Its
// first step is the shape SQLite's schema has reached.
var postgresSchema = []string{
	`CREATE TABLE vms (
		name            TEXT PRIMARY KEY,
		owner           TEXT NOT NULL,
		image           TEXT NOT NULL,
		cpus            INTEGER NOT NULL,
		memory_bytes    BIGINT NOT NULL,
		disk_bytes      BIGINT NOT NULL,
		state           TEXT NOT NULL,
		reason          TEXT NOT NULL DEFAULT '',
		vmm             TEXT NOT NULL DEFAULT '',
		accel           TEXT NOT NULL DEFAULT '',
		idle_timeout_ms BIGINT NOT NULL DEFAULT 0,
		created_at      BIGINT NOT NULL,
		last_active     BIGINT NOT NULL,
		spec_json       TEXT NOT NULL DEFAULT '{}',
		generation      BIGINT NOT NULL DEFAULT 0,
		wake_on_boot    BOOLEAN NOT NULL DEFAULT false
	);
	CREATE INDEX vms_owner ON vms (owner);
	CREATE TABLE checkpoints (
		vm           TEXT NOT NULL,
		id           TEXT NOT NULL,
		seq          INTEGER NOT NULL,
		parent       TEXT NOT NULL DEFAULT '',
		kind         TEXT NOT NULL,
		comment      TEXT NOT NULL DEFAULT '',
		created_at   BIGINT NOT NULL,
		memory_bytes BIGINT NOT NULL DEFAULT 0,
		disk_bytes   BIGINT NOT NULL DEFAULT 0,
		vmm          TEXT NOT NULL DEFAULT '',
		seal         TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (vm, id)
	);
	CREATE TABLE keys (
		fingerprint TEXT PRIMARY KEY,
		"user"      TEXT NOT NULL,
		name        TEXT NOT NULL DEFAULT '',
		public_key  TEXT NOT NULL,
		created_at  BIGINT NOT NULL
	);
	CREATE TABLE tokens (
		id          TEXT PRIMARY KEY,
		"user"      TEXT NOT NULL,
		name        TEXT NOT NULL,
		admin       BOOLEAN NOT NULL DEFAULT false,
		hash        TEXT NOT NULL UNIQUE,
		created_at  BIGINT NOT NULL,
		last_used   BIGINT NOT NULL DEFAULT 0,
		CONSTRAINT tokens_user_name UNIQUE ("user", name)
	);
	CREATE TABLE checkpoint_seqs (
		vm   TEXT PRIMARY KEY,
		last INTEGER NOT NULL
	)`,
	`CREATE TABLE hosts (
		name          TEXT PRIMARY KEY,
		address       TEXT NOT NULL DEFAULT '',
		version       TEXT NOT NULL DEFAULT '',
		vmm           TEXT NOT NULL DEFAULT '',
		cpu_model     TEXT NOT NULL DEFAULT '',
		cpus          INTEGER NOT NULL DEFAULT 0,
		memory_budget BIGINT NOT NULL DEFAULT 0,
		memory_free   BIGINT NOT NULL DEFAULT 0,
		running       INTEGER NOT NULL DEFAULT 0,
		sleeping      INTEGER NOT NULL DEFAULT 0,
		draining      BOOLEAN NOT NULL DEFAULT false,
		started_at    BIGINT NOT NULL DEFAULT 0,
		heartbeat_at  BIGINT NOT NULL DEFAULT 0
	);
	CREATE TABLE leases (
		vm         TEXT PRIMARY KEY,
		host       TEXT NOT NULL DEFAULT '',
		instance   TEXT NOT NULL DEFAULT '',
		generation BIGINT NOT NULL DEFAULT 0,
		expires_at BIGINT NOT NULL DEFAULT 0
	);
	CREATE INDEX leases_host ON leases (host)`,
	`ALTER TABLE hosts ADD COLUMN compat TEXT NOT NULL DEFAULT ''`,
	`CREATE TABLE disk_usage (
		vm         TEXT PRIMARY KEY,
		created    BIGINT NOT NULL,
		generation BIGINT NOT NULL,
		data       BIGINT NOT NULL
	)`,
}

// postgresMigrationLock is the advisory lock key under which a daemon
// migrates the schema, so that hosts starting together take turns.
const postgresMigrationLock = 0x64656e // "den"

// OpenPostgres connects to the PostgreSQL database at url (a postgres://
// URL or a key=value string) and brings its schema up to date. Several
// hosts may open the same database: they share one record.
func OpenPostgres(ctx context.Context, url string) (*DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("open postgres registry: %w", err)
	}
	// A host frozen inside a transaction must not hold its row locks
	// (and so a takeover) for long: the server ends such a session.
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "5000"
	cfg.RuntimeParams["lock_timeout"] = "15000"
	e := &ended{}
	db := sql.OpenDB(newEndedConnector(*cfg, e))
	db.SetMaxOpenConns(16)
	db.SetConnMaxIdleTime(5 * time.Minute)
	d := newDB(db, postgresDialect)
	d.ended = e
	// Lease renewals and heartbeats get connections of their own: a
	// busy record never starves them.
	meta := sql.OpenDB(newEndedConnector(*cfg, e))
	meta.SetMaxOpenConns(2)
	d.meta = &conn{db: meta, d: postgresDialect}
	if err := d.migratePostgres(ctx); err != nil {
		d.Close()
		return nil, fmt.Errorf("open postgres registry: %w", err)
	}
	return d, nil
}

func (d *DB) migratePostgres(ctx context.Context) error {
	tx, err := d.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, postgresMigrationLock); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS den_schema (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	var v int
	switch err := tx.QueryRowContext(ctx, `SELECT version FROM den_schema`).Scan(&v); err {
	case nil:
	case sql.ErrNoRows:
		if _, err := tx.ExecContext(ctx, `INSERT INTO den_schema (version) VALUES (0)`); err != nil {
			return err
		}
	default:
		return err
	}
	if v > len(postgresSchema) {
		return fmt.Errorf("schema version %d is newer than this den knows (%d): run a newer den", v, len(postgresSchema))
	}
	for i := v; i < len(postgresSchema); i++ {
		if _, err := tx.ExecContext(ctx, postgresSchema[i]); err != nil {
			return fmt.Errorf("schema step %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE den_schema SET version = ?`, len(postgresSchema)); err != nil {
		return err
	}
	return tx.Commit()
}
