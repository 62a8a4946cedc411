package registry

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/pgtest"
	"github.com/denhq/den/internal/poll"
)

// TestPostgresHostsShareOneRecord: several daemons (here, several
// connections) open one fresh PostgreSQL database at once; each migrates
// or waits its turn, and then they race on one record. Of writers that
// decided on the same generation exactly one wins; of checkpoints
// recorded at once under one sequence number, exactly one is kept.
func TestPostgresHostsShareOneRecord(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	const hosts = 4
	dbs := make([]*DB, hosts)
	errs := make([]error, hosts)
	var wg sync.WaitGroup
	for i := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dbs[i], errs[i] = OpenPostgres(ctx, url)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("host %d opens the shared database: %v", i, err)
		}
		defer dbs[i].Close()
	}
	if b := dbs[0].Backend(); b != "postgres" {
		t.Fatalf("backend %q", b)
	}
	newVM(t, dbs[0], "box")
	vm, err := dbs[1].GetVM(ctx, "box")
	if err != nil {
		t.Fatalf("another host reads the record: %v", err)
	}

	for round := range 10 {
		wins := make([]error, hosts)
		for i, db := range dbs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, wins[i] = db.UpdateVMIf(ctx, "box", vm.Generation, func(v *VM) error {
					v.Reason = "host " + string(rune('a'+i))
					return nil
				})
			}()
		}
		wg.Wait()
		won := 0
		for i, err := range wins {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ErrStale):
				t.Fatalf("round %d: host %d: %v, want a win or %v", round, i, err, ErrStale)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d writers won at generation %d, want exactly 1", round, won, vm.Generation)
		}
		if vm, err = dbs[0].GetVM(ctx, "box"); err != nil {
			t.Fatal(err)
		}
	}

	// Unconditional updates wait for each other: none is lost. A lock
	// held meanwhile lines them all up before any of them can run.
	before := vm.Generation
	hold, err := dbs[0].db.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.ExecContext(ctx, `SELECT name FROM vms WHERE name = 'box' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	for _, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.UpdateVM(ctx, "box", func(v *VM) error { v.CPUs++; return nil }); err != nil {
				t.Errorf("update: %v", err)
			}
		}()
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var waiting int
		if err := dbs[0].db.QueryRowContext(waitCtx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatalf("waiting for %d updates to queue behind the lock: %v", hosts, err)
		}
		if waiting == hosts {
			break
		}
		select {
		case <-waitCtx.Done():
			t.Fatalf("%d of %d updates queued behind the lock", waiting, hosts)
		case <-time.After(20 * time.Millisecond):
		}
	}
	hold.Rollback()
	wg.Wait()
	if vm, err = dbs[0].GetVM(ctx, "box"); err != nil || vm.CPUs != 1+hosts || vm.Generation != before+hosts {
		t.Fatalf("after %d concurrent updates: cpus %d generation %d (from %d): %v", hosts, vm.CPUs, vm.Generation, before, err)
	}

	seq, err := dbs[0].NextCheckpointSeq(ctx, "box")
	if err != nil {
		t.Fatal(err)
	}
	added := make([]error, hosts)
	for i, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			added[i] = db.AddCheckpoint(ctx, Checkpoint{VM: "box", ID: checkpoint.ID(seq), Seq: seq,
				Kind: checkpoint.KindMemoryDisk, CreatedAt: time.Now()})
		}()
	}
	wg.Wait()
	kept := 0
	for i, err := range added {
		switch {
		case err == nil:
			kept++
		case !errors.Is(err, ErrExists):
			t.Fatalf("host %d records %s: %v, want success or %v", i, checkpoint.ID(seq), err, ErrExists)
		}
	}
	if cps, err := dbs[2].ListCheckpoints(ctx, "box"); kept != 1 || err != nil || len(cps) != 1 {
		t.Fatalf("%d hosts recorded %s; the catalog holds %+v (%v)", kept, checkpoint.ID(seq), cps, err)
	}
}

// TestPostgresRefusesNewerSchema: a database a newer den migrated is
// refused with a message that says so, not written to.
func TestPostgresRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	db, err := OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.db.ExecContext(ctx, `UPDATE den_schema SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := OpenPostgres(ctx, url); err == nil || !strings.Contains(err.Error(), "newer than this den knows") {
		t.Fatalf("a newer schema opened: %v", err)
	}
}

// TestPostgresUnreachable: a server that does not answer is one clear
// error, bounded by the caller's context.
func TestPostgresUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := OpenPostgres(ctx, "postgres://den@127.0.0.1:1/den?sslmode=disable&connect_timeout=5")
	if err == nil || !strings.Contains(err.Error(), "open postgres registry") {
		t.Fatalf("an unreachable server: %v", err)
	}
}

// TestPostgresRestart: after PostgreSQL restarts, every pooled connection
// is dead; the first reads after it, and the writes after them (of the
// record and of the leases' own pool, outside a transaction and in one),
// still succeed.
func TestPostgresRestart(t *testing.T) {
	ctx := context.Background()
	pg, db := ownPostgres(t)
	l, err := db.AcquireLease(ctx, "box", "host-a", "i1", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Several connections in each pool, all idle.
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.GetVM(ctx, "box"); err != nil {
				t.Error(err)
			}
			if _, err := db.RenewLeases(ctx, "host-a", "i1", time.Minute); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()

	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := db.GetVM(ctx, "box"); err != nil {
			t.Fatalf("read %d after the restart: %v", i, err)
		}
	}
	if _, err := db.RenewLeases(ctx, "host-a", "i1", time.Minute); err != nil {
		t.Fatalf("renewal after the restart: %v", err)
	}
	for i := range 8 {
		if err := db.TouchVM(ctx, "box", time.Now()); err != nil {
			t.Fatalf("statement %d after the restart: %v", i, err)
		}
	}
	db.Fence(l)
	if _, err := db.UpdateVM(ctx, "box", func(v *VM) error { v.Reason = "after"; return nil }); err != nil {
		t.Fatalf("fenced update after the restart: %v", err)
	}
	if err := db.TouchVM(ctx, "box", time.Now()); err != nil {
		t.Fatalf("fenced statement after the restart: %v", err)
	}
}

// TestPostgresDown: an operation that meets PostgreSQL down for a
// restart waits for it to come back, reads and writes alike; one that
// meets it down for longer than a restart takes fails, saying so.
func TestPostgresDown(t *testing.T) {
	ctx := context.Background()
	pg, db := ownPostgres(t)
	pg.Down()
	done := make(chan error, 2)
	go func() {
		_, err := db.GetVM(ctx, "box")
		done <- err
	}()
	go func() { done <- db.TouchVM(ctx, "box", time.Now()) }()
	// Up once the server refused them a connection: they wait for it.
	if !poll.Until(time.Minute, func() bool { return db.ended.refused.Load() > 0 }) {
		t.Fatal("no operation asked the server that is down for a connection")
	}
	if err := pg.Up(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("an operation across a restart: %v", err)
		}
	}
	pg.Down()
	start := time.Now()
	_, err := db.GetVM(ctx, "box")
	if err == nil || !strings.Contains(err.Error(), "postgresql took no connection within 10s") {
		t.Fatalf("a read with PostgreSQL down: %v", err)
	}
	t.Logf("with PostgreSQL down, a read failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if err := pg.Up(); err != nil {
		t.Fatal(err)
	}
}

// ownPostgres is a PostgreSQL server of the test's own (to restart or
// stop), and a registry on it that records a VM, box.
func ownPostgres(t *testing.T) (*pgtest.Server, *DB) {
	pg := pgtest.Start(t)
	db, err := OpenPostgres(context.Background(), pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	newVM(t, db, "box")
	return pg, db
}
