package registry

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/internal/pgtest"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/validate"
)

// TestLeases: a lease is one host's at a time; it changes hands only when
// released or expired past the grace, each time at a new generation; a
// host that lost it can neither renew nor release it.
func TestLeases(t *testing.T) { eachBackend(t, testLeases) }

func testLeases(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const long = time.Hour
	if l, err := db.GetLease(ctx, "box"); err != nil || l.Host != "" || l.Held() {
		t.Fatalf("a lease never taken: %+v %v", l, err)
	}
	a, err := db.AcquireLease(ctx, "box", "host-a", "inst", long, long)
	if err != nil || a.Generation != 1 || !a.Held() {
		t.Fatalf("first acquire: %+v %v", a, err)
	}
	if _, err := db.AcquireLease(ctx, "box", "host-b", "inst", long, 0); !errors.Is(err, ErrLeased) {
		t.Fatalf("another host took a held lease: %v", err)
	}
	if _, err := db.AcquireLease(ctx, "box", "host-a", "other-daemon", long, 0); !errors.Is(err, ErrLeased) ||
		!strings.Contains(err.Error(), "another daemon named") {
		t.Fatalf("another daemon of the same host name took a held lease: %v", err)
	}
	if got, _ := db.RenewLeases(ctx, "host-a", "other-daemon", long); len(got) != 0 {
		t.Fatalf("another daemon of the same host name renewed its lease: %+v", got)
	}
	if again, err := db.AcquireLease(ctx, "box", "host-a", "inst", long, long); err != nil || again.Generation != a.Generation {
		t.Fatalf("the holder acquires again: %+v %v, want generation %d", again, err, a.Generation)
	}
	if _, err := db.AcquireLease(ctx, "box", "bad host", "inst", long, long); !errors.Is(err, validate.ErrInvalid) {
		t.Fatalf("a bad host name: %v", err)
	}
	renewed, err := db.RenewLeases(ctx, "host-a", "inst", long)
	if err != nil || len(renewed) != 1 || renewed[0].VM != "box" || renewed[0].Generation != a.Generation {
		t.Fatalf("renew: %+v %v", renewed, err)
	}
	if err := db.ReleaseLease(ctx, a); err != nil {
		t.Fatal(err)
	}
	b, err := db.AcquireLease(ctx, "box", "host-b", "inst", long, long)
	if err != nil || b.Generation != a.Generation+1 {
		t.Fatalf("acquire after a release: %+v %v, want generation %d", b, err, a.Generation+1)
	}
	if err := db.ReleaseLease(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a stale release: %v", err)
	}
	if got, _ := db.RenewLeases(ctx, "host-a", "inst", long); len(got) != 0 {
		t.Fatalf("host-a renewed leases it lost: %+v", got)
	}
	if err := db.ReleaseLease(ctx, b); err != nil {
		t.Fatal(err)
	}

	// Expiry, by the database's clock: first past the TTL, then past
	// the grace.
	// (The grace is long enough for the checks within it on a loaded
	// machine.)
	const ttl, grace = 300 * time.Millisecond, 3 * time.Second
	c, err := db.AcquireLease(ctx, "box", "host-c", "inst", ttl, grace)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lease to expire", func() bool {
		l, err := db.GetLease(ctx, "box")
		return err == nil && !l.Held()
	})
	if got, _ := db.RenewLeases(ctx, "host-c", "inst", long); len(got) != 0 {
		t.Fatalf("an expired lease was renewed: %+v", got)
	}
	if _, err := db.AcquireLease(ctx, "box", "host-d", "inst", long, long); !errors.Is(err, ErrLeased) {
		t.Fatalf("taken over within the grace: %v", err)
	}
	if exp, err := db.ExpiredLeases(ctx, 0); err != nil || len(exp) != 1 || exp[0].Host != "host-c" {
		t.Fatalf("expired leases: %+v %v", exp, err)
	}
	waitFor(t, "the grace to pass", func() bool {
		exp, err := db.ExpiredLeases(ctx, grace)
		return err == nil && len(exp) == 1
	})
	d, err := db.AcquireLease(ctx, "box", "host-d", "inst", long, grace)
	if err != nil || d.Generation != c.Generation+1 || d.TakenFrom != "host-c" {
		t.Fatalf("takeover after the grace: %+v %v, want generation %d, taken from host-c", d, err, c.Generation+1)
	}
	if b.TakenFrom != "" || c.TakenFrom != "" {
		t.Fatalf("leases acquired free say they were taken over: %+v, %+v", b, c)
	}
	if err := db.ReleaseLease(ctx, c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the old holder released the lease after a takeover: %v", err)
	}
	if exp, err := db.ExpiredLeases(ctx, 0); err != nil || len(exp) != 0 {
		t.Fatalf("expired leases after the takeover: %+v %v", exp, err)
	}
	// A host taking back its own lapsed lease gets a new generation too:
	// it stopped the VM when the lease lapsed.
	e, err := db.AcquireLease(ctx, "other", "host-e", "inst", ttl, long)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lease to expire", func() bool {
		l, err := db.GetLease(ctx, "other")
		return err == nil && !l.Held()
	})
	if e2, err := db.AcquireLease(ctx, "other", "host-e", "inst", long, long); err != nil || e2.Generation != e.Generation+1 {
		t.Fatalf("the holder takes back its lapsed lease: %+v %v, want generation %d", e2, err, e.Generation+1)
	}
}

// TestPostgresLeaseRace: hosts racing for a free lease, 20 times: exactly
// one wins each time, at a new generation.
func TestPostgresLeaseRace(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	const hosts = 4
	dbs := make([]*DB, hosts)
	for i := range dbs {
		db, err := OpenPostgres(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[i] = db
	}
	var last int64
	for round := range 20 {
		got := make([]Lease, hosts)
		errs := make([]error, hosts)
		var wg sync.WaitGroup
		for i, db := range dbs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = db.AcquireLease(ctx, "box", "host-"+string(rune('a'+i)), "inst", time.Hour, time.Hour)
			}()
		}
		wg.Wait()
		var won []Lease
		for i, err := range errs {
			switch {
			case err == nil:
				won = append(won, got[i])
			case !errors.Is(err, ErrLeased):
				t.Fatalf("round %d: host %d: %v", round, i, err)
			}
		}
		if len(won) != 1 || won[0].Generation != last+1 {
			t.Fatalf("round %d: winners %+v, want exactly one at generation %d", round, won, last+1)
		}
		last = won[0].Generation
		if err := dbs[0].ReleaseLease(ctx, won[0]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHosts: heartbeats record a host by the database's clock; draining
// stays across heartbeats.
func TestHosts(t *testing.T) { eachBackend(t, testHosts) }

func testHosts(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	db, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := time.Now().UTC().Truncate(time.Millisecond)
	a := Host{Name: "host-a", Address: "127.0.0.1:7443", Version: "dev", VMM: "qemu", CPUModel: "Test CPU", CPUs: 2,
		MemoryBudgetBytes: 8 << 30, MemoryFreeBytes: 6 << 30, Running: 2, Sleeping: 5, StartedAt: start}
	if err := db.Heartbeat(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := db.Heartbeat(ctx, Host{Name: "host-b", StartedAt: start}); err != nil {
		t.Fatal(err)
	}
	if err := db.Heartbeat(ctx, Host{Name: "-bad"}); !errors.Is(err, validate.ErrInvalid) {
		t.Fatalf("a bad host name: %v", err)
	}
	hosts, now, err := db.ListHosts(ctx)
	if err != nil || len(hosts) != 2 || hosts[0].Name != "host-a" || hosts[1].Name != "host-b" {
		t.Fatalf("hosts: %+v %v", hosts, err)
	}
	got := hosts[0]
	first := got.Heartbeat
	got.Heartbeat = time.Time{}
	if got != a {
		t.Fatalf("host-a read back as %+v, want %+v", got, a)
	}
	if age := now.Sub(first); age < 0 || age > time.Minute {
		t.Fatalf("heartbeat %s, database now %s", first, now)
	}
	if _, err := db.SetDraining(ctx, "host-a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetDraining(ctx, "host-z", true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("drain an unknown host: %v", err)
	}
	waitFor(t, "the database's clock to move", func() bool {
		_, n, err := db.ListHosts(ctx)
		return err == nil && n.After(first)
	})
	a.Running = 3
	if err := db.Heartbeat(ctx, a); err != nil {
		t.Fatal(err)
	}
	hosts, _, err = db.ListHosts(ctx)
	if err != nil || !hosts[0].Draining || hosts[0].Running != 3 || !hosts[0].Heartbeat.After(first) {
		t.Fatalf("after a second heartbeat: %+v %v", hosts[0], err)
	}
}

// waitFor waits until cond holds, for at most 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll.Until(30*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestFencedWrites: a store fenced by a host's lease writes the record
// only while that lease is held; once another host took it over, every
// write is refused, while heartbeats and lease calls go on.
func TestFencedWrites(t *testing.T) { eachBackend(t, testFencedWrites) }

func testFencedWrites(t *testing.T, open func() (*DB, error)) {
	ctx := context.Background()
	a, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// host-a's lease is long enough for its writes on a loaded machine.
	const ttl, grace = 3 * time.Second, 300 * time.Millisecond
	la, err := a.AcquireLease(ctx, "@cluster", "host-a", "inst", ttl, grace)
	if err != nil {
		t.Fatal(err)
	}
	a.Fence(la)
	newVM(t, a, "box")
	addCP(t, a, "box", "")
	if _, err := a.UpdateVM(ctx, "box", func(v *VM) error { v.Reason = "a"; return nil }); err != nil {
		t.Fatalf("a write under a held lease: %v", err)
	}
	waitFor(t, "host-a's lease to lapse past the grace", func() bool {
		exp, err := b.ExpiredLeases(ctx, grace)
		return err == nil && len(exp) == 1
	})
	lb, err := b.AcquireLease(ctx, "@cluster", "host-b", "inst", time.Hour, grace)
	if err != nil {
		t.Fatal(err)
	}
	b.Fence(lb)
	if _, err := b.UpdateVM(ctx, "box", func(v *VM) error { v.Reason = "b"; return nil }); err != nil {
		t.Fatalf("host-b's write after the takeover: %v", err)
	}
	writes := map[string]func() error{
		"update": func() error {
			_, err := a.UpdateVM(ctx, "box", func(v *VM) error { v.Reason = "late"; return nil })
			return err
		},
		"touch": func() error { return a.TouchVM(ctx, "box", time.Now().Add(time.Hour)) },
		"create": func() error {
			return a.CreateVM(ctx, VM{Name: "late", Owner: "a", Image: "minimal", CPUs: 1, State: StateRunning})
		},
		"checkpoint": func() error {
			return a.AddCheckpoint(ctx, Checkpoint{VM: "box", ID: "cp-9", Seq: 9, Kind: "memory+disk", CreatedAt: time.Now()})
		},
		"delete checkpoint": func() error { return a.DeleteCheckpoint(ctx, "box", "cp-1") },
		"delete":            func() error { return a.DeleteVM(ctx, "box") },
		"key": func() error {
			return a.AddKey(ctx, Key{Fingerprint: "SHA256:zz", User: "a", PublicKey: "ssh-ed25519 AAAA"})
		},
	}
	for what, write := range writes {
		if err := write(); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("host-a's %s after losing its lease: %v, want %v", what, err, ErrLeaseLost)
		}
	}
	vm, err := b.GetVM(ctx, "box")
	if err != nil || vm.Reason != "b" {
		t.Fatalf("the record after host-a's late writes: %+v %v", vm, err)
	}
	if cps, _ := b.ListCheckpoints(ctx, "box"); len(cps) != 1 {
		t.Fatalf("checkpoints after host-a's late writes: %+v", cps)
	}
	if err := a.Heartbeat(ctx, Host{Name: "host-a"}); err != nil {
		t.Fatalf("host-a's heartbeat: %v", err)
	}
}
