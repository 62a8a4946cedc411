//go:build linux

package machine_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// hostLeases are a cluster host's VM leases (machine.Leases) in the test's
// registry, as the daemon takes them.
type hostLeases struct {
	db         registry.LeaseStore
	host, inst string
	ttl, every time.Duration
	// refuse fails this many Release calls, as a registry away would.
	refuse atomic.Int32
}

func (l *hostLeases) Acquire(ctx context.Context, vm string) (registry.Lease, error) {
	return l.db.AcquireLease(ctx, vm, l.host, l.inst, l.ttl, l.ttl/2)
}
func (l *hostLeases) Release(ctx context.Context, x registry.Lease) error {
	if l.refuse.Add(-1) >= 0 {
		return errors.New("registry away")
	}
	return l.db.ReleaseLease(ctx, x)
}
func (l *hostLeases) Get(ctx context.Context, vm string) (registry.Lease, error) {
	return l.db.GetLease(ctx, vm)
}
func (l *hostLeases) Lapsed(ctx context.Context) ([]registry.Lease, error) {
	return l.db.ExpiredLeases(ctx, l.ttl/2)
}
func (l *hostLeases) Mine(ctx context.Context) ([]registry.Lease, error) {
	return l.db.HostLeases(ctx, l.host)
}
func (l *hostLeases) Every() time.Duration { return l.every }

// newHostA is a test env whose Manager is cluster host host-a, with
// leases of ttl looked at every every; tweak, when set, changes the
// rest of its config.
func newHostA(t *testing.T, ttl, every time.Duration, tweak func(*machine.Config)) (*env, *hostLeases) {
	t.Helper()
	var here *hostLeases
	e := newEnvWith(t, func(c *machine.Config) {
		here = &hostLeases{db: c.Registry.(registry.LeaseStore), host: "host-a", inst: "a", ttl: ttl, every: every}
		c.Leases, c.HostName = here, "host-a"
		if tweak != nil {
			tweak(c)
		}
	})
	return e, here
}

// TestVMLeases: on a cluster host, a VM's lease is held while the VM runs
// there and until the digests of the memory it slept with are written,
// then given back; a VM whose lease another host holds is refused (a
// machine.HeldError naming that host), and a read there records nothing;
// a VM whose holder let its lease lapse is taken over: recorded lost,
// with that host, its disk cloned afresh; it waits for a person (a
// session does not start it, a wake boots it).
func TestVMLeases(t *testing.T) {
	e, here := newHostA(t, 6*time.Second, 100*time.Millisecond, nil)
	ctx := ctxT(t)
	// This host renews its leases, as its daemon does; host-b never
	// does: its leases lapse.
	renewing, stopRenewing := context.WithCancel(ctx)
	defer stopRenewing()
	go func() {
		for renewing.Err() == nil {
			_, _ = here.db.RenewLeases(renewing, here.host, here.inst, here.ttl)
			select {
			case <-renewing.Done():
			case <-time.After(here.every):
			}
		}
	}()
	other := &hostLeases{db: here.db, host: "host-b", inst: "b", ttl: 3 * time.Second}
	taken := map[[2]registry.State]bool{}
	e.create("box")
	if l, err := here.Get(ctx, "box"); err != nil || !l.Held() || l.Host != "host-a" {
		t.Fatalf("lease of a running vm: %+v, %v", l, err)
	}
	if _, err := other.Acquire(ctx, "box"); !errors.Is(err, registry.ErrLeased) {
		t.Fatalf("another host took the lease of a vm that runs here: %v", err)
	}
	if err := e.m.Sleep(ctx, "box", false); err != nil {
		t.Fatal(err)
	}
	if !poll.Until(time.Minute, func() bool { l, err := here.Get(ctx, "box"); return err == nil && !l.Held() }) {
		t.Fatal("the lease of a vm put to sleep was never given back")
	}
	if e.m.Sealing("vms/box/suspend") {
		t.Fatal("the lease was given back before the digests of the memory were written")
	}

	// Another host holds it (it woke it there): refused here, naming that
	// host, and a read records nothing.
	if _, err := other.Acquire(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	var held *machine.HeldError
	if err := e.m.Wake(ctx, "box"); !errors.As(err, &held) || held.Host != "host-b" {
		t.Fatalf("wake of a vm another host holds: %v", err)
	}
	if _, err := e.m.Get(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	e.wantState("box", registry.StateSleeping)

	// host-b is lost: its lease lapses, and this host takes the VM over.
	vm := e.record("box")
	if _, err := e.reg.UpdateVMIf(ctx, "box", vm.Generation, func(v *registry.VM) error {
		v.State = registry.StateRunning // it ran there
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !poll.Until(time.Minute, func() bool {
		r, err := e.m.Record(ctx, "box")
		return err == nil && r.State == registry.StateLost
	}) {
		t.Fatalf("the vm of a lost host was not taken over: %+v", e.record("box"))
	}
	if r := e.record("box"); !strings.Contains(r.Reason, "lost with host host-b") || !strings.Contains(r.Reason, "its disk was cloned afresh") {
		t.Fatalf("reason of a vm taken over: %q", r.Reason)
	}
	taken[[2]registry.State{registry.StateRunning, registry.StateLost}] = true
	// The takeover gives the lease back once it is done (the digests
	// the lost host left missing written), after the record says lost.
	if !poll.Until(time.Minute, func() bool {
		l, err := here.Get(ctx, "box")
		return err == nil && !l.Held()
	}) {
		l, err := here.Get(ctx, "box")
		t.Fatalf("lease of a lost vm taken over: %+v, %v", l, err)
	}
	if _, err := e.m.Open(ctx, "box", ""); err == nil || !errors.Is(err, machine.ErrConflict) ||
		!strings.Contains(err.Error(), `vm "box" is lost (lost with host host-b`) || !strings.Contains(err.Error(), "den wake box boots it from its disk") {
		t.Fatalf("a session on a lost vm: %v", err)
	}
	e.wantState("box", registry.StateLost)
	if err := e.m.Wake(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	e.wantState("box", registry.StateRunning)
	taken[[2]registry.State{registry.StateLost, registry.StateRunning}] = true

	// A sleeping VM and a stopped one whose leases host-b let lapse (it
	// was waking or booting them) are lost too; a restore brings one
	// back (through stopped), and a lost VM can be removed.
	cp, err := e.m.Checkpoint(ctx, "box", machine.CheckpointOptions{DiskOnly: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Sleep(ctx, "box", false); err != nil {
		t.Fatal(err)
	}
	e.create("down")
	e.drv.VM(e.state.Run("down")).Kill()
	if !poll.Until(time.Minute, func() bool { return e.record("down").State == registry.StateStopped }) {
		t.Fatalf("down was not recorded stopped: %+v", e.record("down"))
	}
	for _, name := range []string{"box", "down"} {
		if !poll.Until(time.Minute, func() bool { _, err := other.Acquire(ctx, name); return err == nil }) {
			t.Fatalf("host-b never got the lease of %s", name)
		}
	}
	for name, from := range map[string]registry.State{"box": registry.StateSleeping, "down": registry.StateStopped} {
		if !poll.Until(time.Minute, func() bool { r, err := e.m.Record(ctx, name); return err == nil && r.State == registry.StateLost }) {
			t.Fatalf("%s of a lost host was not taken over: %+v", name, e.record(name))
		}
		taken[[2]registry.State{from, registry.StateLost}] = true
	}
	seen := e.watchStates("box")
	_, err = e.m.Restore(ctx, "box", cp.ID, machine.RestoreOptions{}, nil)
	states := seen()
	if err != nil {
		t.Fatal(err)
	}
	e.wantState("box", registry.StateRunning)
	if states[registry.StateStopped] {
		taken[[2]registry.State{registry.StateLost, registry.StateStopped}] = true
	}
	if err := e.m.Remove(ctx, "down", true); err != nil {
		t.Fatal(err)
	}
	taken[[2]registry.State{registry.StateLost, registry.StateDeleting}] = true
	for from, tos := range registry.Transitions() {
		for _, to := range tos {
			if (from == registry.StateLost || to == registry.StateLost) && !taken[[2]registry.State{from, to}] {
				t.Errorf("transition %s -> %s not exercised", from, to)
			}
		}
	}
}

// TestStrayVMMOfAnotherHost: a VMM still running on this host for a VM
// another host now holds (this host's fence failed to stop it) is
// stopped at start-up, and the VM is left to that host.
func TestStrayVMMOfAnotherHost(t *testing.T) {
	e, here := newHostA(t, time.Minute, 100*time.Millisecond, nil)
	ctx := ctxT(t)
	e.create("box")
	if err := e.m.Sleep(ctx, "box", false); err != nil {
		t.Fatal(err)
	}
	other := &hostLeases{db: here.db, host: "host-b", inst: "b", ttl: time.Minute}
	if !poll.Until(time.Minute, func() bool { _, err := other.Acquire(ctx, "box"); return err == nil }) {
		t.Fatal("host-b never got the lease of box")
	}
	// A process stands in for the VMM: box's PID file names it.
	e.restartStops(standIn(t, e.state.Run("box")), "a vmm of a vm host-b holds")
	e.wantState("box", registry.StateSleeping)
	if l, err := here.Get(ctx, "box"); err != nil || !l.Held() || l.Host != "host-b" {
		t.Fatalf("lease of box after the restart: %+v, %v", l, err)
	}
}

// TestStartLooksAtItsOwn: a cluster host's start claims, to reconcile,
// the VMs whose lease names it (a VM it runs), not a VM whose lease it
// gave back (asleep, its digests written): that lease is left as it was,
// not taken and given back (which would make its generation grow). A
// host with a thousand sleeping VMs starts without a round of leases.
func TestStartLooksAtItsOwn(t *testing.T) {
	e, _ := newHostA(t, time.Minute, time.Second, nil)
	ctx := ctxT(t)
	here := e.cfg.Leases
	e.create("kept")
	e.create("given")
	if err := e.m.Sleep(ctx, "given", false); err != nil {
		t.Fatal(err)
	}
	var given registry.Lease
	if !poll.Until(time.Minute, func() bool {
		var err error
		given, err = here.Get(ctx, "given")
		return err == nil && !given.Held()
	}) {
		t.Fatal("the lease of a vm put to sleep was never given back")
	}
	kept, err := here.Get(ctx, "kept")
	if err != nil || !kept.Held() {
		t.Fatalf("lease of a running vm: %+v, %v", kept, err)
	}

	e.restart()
	e.wantState("kept", registry.StateRunning)
	if l, err := here.Get(ctx, "kept"); err != nil || !l.Held() || l.Generation != kept.Generation {
		t.Fatalf("lease of the running vm after the start: %+v (was %+v), %v", l, kept, err)
	}
	if l, err := here.Get(ctx, "given"); err != nil || l.Host != "" || l.Generation != given.Generation {
		t.Fatalf("the start took the lease of a vm it had given back: %+v (was %+v), %v", l, given, err)
	}
	if err := e.m.Wake(ctx, "given"); err != nil {
		t.Fatal(err)
	}
}

// TestStopWritesDigestsFirst: a cluster host stopped while it writes the
// digests of a VM's sleep writes them first, and gives the VM's lease
// back: kept, it would lapse while the host is down, and another host
// would take the VM over as a lost host's.
func TestStopWritesDigestsFirst(t *testing.T) {
	defer machine.SetSealDelay(2 * time.Second)()
	e, _ := newHostA(t, time.Minute, time.Second, nil)
	ctx := ctxT(t)
	e.create("box")
	if err := e.m.Sleep(ctx, "box", false); err != nil {
		t.Fatal(err)
	}
	if !e.m.Sealing("vms/box/suspend") {
		t.Fatal("the digests of the sleep were written before the test could stop the host")
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err := e.cfg.Leases.Get(ctx, "box"); err != nil || l.Held() {
		t.Fatalf("lease of a vm after a stop that wrote its digests: %+v, %v", l, err)
	}
	e.open()
	if err := e.m.Wake(ctx, "box"); err != nil {
		t.Fatal(err)
	}
}

// TestStopCutsDigestsKeepsLease: a cluster host whose stop's bound runs
// out before the digests of a VM's sleep are written keeps the VM's
// lease (they are missing), and its next start claims the VM, writes
// them and gives the lease back.
func TestStopCutsDigestsKeepsLease(t *testing.T) {
	undo := machine.SetSealDelay(time.Hour)
	defer undo()
	e, _ := newHostA(t, time.Minute, time.Second, func(c *machine.Config) { c.DrainTimeout = 500 * time.Millisecond })
	ctx := ctxT(t)
	e.create("box")
	if err := e.m.Sleep(ctx, "box", false); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err := e.cfg.Leases.Get(ctx, "box"); err != nil || !l.Held() || l.Host != "host-a" {
		t.Fatalf("lease of a vm whose digests a stop cut short: %+v, %v", l, err)
	}
	undo()
	e.open()
	if !poll.Until(time.Minute, func() bool {
		l, err := e.cfg.Leases.Get(ctx, "box")
		return err == nil && !l.Held() && !e.m.Sealing("vms/box/suspend")
	}) {
		t.Fatal("the next start did not write the digests and give the lease back")
	}
	if err := e.m.Wake(ctx, "box"); err != nil {
		t.Fatal(err)
	}
}

// TestFailedGiveBackRetried: a VM's lease whose giving back failed (the
// registry away) is given back again, without another operation on the
// VM: held, it would be renewed, and the VM refused on other hosts.
func TestFailedGiveBackRetried(t *testing.T) {
	e, here := newHostA(t, time.Hour, 100*time.Millisecond, nil) // a lease that does not lapse meanwhile
	ctx := ctxT(t)
	e.create("box")
	here.refuse.Store(1)
	if err := e.m.Sleep(ctx, "box", false); err != nil {
		t.Fatal(err)
	}
	if !poll.Until(time.Minute, func() bool {
		l, err := here.Get(ctx, "box")
		return err == nil && !l.Held()
	}) {
		t.Fatalf("the lease of a sleeping vm whose giving back failed is still held (refusals left %d)", here.refuse.Load())
	}
	if n := here.refuse.Load(); n >= 0 {
		t.Fatalf("the lease was given back without a refusal: %d left", n)
	}
	other := &hostLeases{db: here.db, host: "host-b", inst: "b", ttl: time.Minute}
	if _, err := other.Acquire(ctx, "box"); err != nil {
		t.Fatalf("another host takes the sleeping vm's lease: %v", err)
	}
}
