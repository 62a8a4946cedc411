package machine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// Leases are a cluster's VM leases as this host takes them: a VM runs,
// and its record and files are worked on, only on the host that holds
// its lease. Leases are renewed together with the host's own lease (and
// the fence deadline pushed) by the daemon, not here.
type Leases interface {
	// Acquire takes the VM's lease for this host: free, lapsed past the
	// grace (its TakenFrom then names the lost host), or this host's
	// already. It wraps registry.ErrLeased while another host holds it.
	Acquire(ctx context.Context, vm string) (registry.Lease, error)
	// Release gives the lease back.
	Release(ctx context.Context, l registry.Lease) error
	// Get reads the VM's lease.
	Get(ctx context.Context, vm string) (registry.Lease, error)
	// Lapsed lists the leases whose holder let them lapse past the
	// grace: the VMs of lost hosts.
	Lapsed(ctx context.Context) ([]registry.Lease, error)
	// Mine lists the leases that name this host, held or let lapse.
	Mine(ctx context.Context) ([]registry.Lease, error)
	// Every is how often to look for lapsed leases.
	Every() time.Duration
}

// HeldError refuses an operation on a VM whose lease another host of
// the cluster holds: it runs there, or an operation there works on it.
// It wraps ErrBusy.
type HeldError struct {
	VM, Host string
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("vm %q is held by host %q: it runs there, or an operation there works on it", e.VM, e.Host)
}

// Unwrap makes errors.Is(err, ErrBusy) hold.
func (e *HeldError) Unwrap() error { return ErrBusy }

// vmLeases takes and gives back the VMs' leases of a cluster host (a
// host of its own takes none), and takes over the VMs of lost hosts.
type vmLeases struct {
	m *Manager
	// mu orders takes and gives back; refs counts the operations that
	// hold each VM's lease now, held is the lease this host holds of it
	// (the last taken), given back by the last of them.
	mu   sync.Mutex
	refs map[string]int
	held map[string]registry.Lease
	// failed are the leases whose giving back failed (the registry
	// away): held, and renewed, until watchLapsed gives them back.
	failed map[string]bool
	// afterDigest counts the leases kept for digests, to give back
	// once they are written (Close waits for it).
	afterDigest sync.WaitGroup
}

// take takes name's lease for an operation that holds the VM's local
// lock, and returns what gives it back when the lock is let go: nothing
// while the VM runs here (its VMM holds it on). A VM whose lease another
// host holds is refused; one whose holder lost it is taken over first.
func (v *vmLeases) take(ctx context.Context, name string) (func(), error) {
	ls := v.m.cfg.Leases
	if ls == nil {
		return func() {}, nil
	}
	v.mu.Lock()
	v.refs[name]++
	v.mu.Unlock()
	l, err := v.acquire(ctx, name)
	if err != nil {
		v.giveBack(name, false)
		return nil, err
	}
	v.mu.Lock()
	v.held[name] = l
	v.mu.Unlock()
	from := l.TakenFrom
	if from == "" {
		from = v.pending(name)
	}
	if from != "" {
		if err := v.takeOver(ctx, name, from); err != nil {
			// The lease stays: given back, the next host to take it
			// would not know whom from, and boot a disk the lost host
			// may still write. The next lock of the VM here (a request
			// another host forwards, too) finishes the takeover.
			v.giveBack(name, true)
			return nil, err
		}
	}
	return func() { v.giveBack(name, false) }, nil
}

// acquire takes name's lease, or says which host holds it.
func (v *vmLeases) acquire(ctx context.Context, name string) (registry.Lease, error) {
	ls := v.m.cfg.Leases
	l, err := ls.Acquire(ctx, name)
	for try := 0; errors.Is(err, registry.ErrLeased); try++ {
		cur, gerr := ls.Get(ctx, name)
		if gerr == nil && cur.Held() {
			return registry.Lease{}, &HeldError{VM: name, Host: cur.Host}
		}
		if gerr != nil || cur.Host != "" || try == 2 {
			// Lapsed, within the grace a lost host's fence has.
			return registry.Lease{}, fmt.Errorf("vm %q: %w: %w", name, err, ErrBusy)
		}
		// Given back between the two reads: take it now.
		l, err = ls.Acquire(ctx, name)
	}
	if err != nil {
		return registry.Lease{}, fmt.Errorf("vm %q: take its lease: %w", name, err)
	}
	return l, nil
}

// giveBack ends an operation's hold on name's lease, and gives the
// lease this host holds back once nothing here needs it: no operation
// holds it, no VMM of the VM runs here, no digests of its snapshots are
// being written (a host that woke it from a snapshot whose digests are
// missing would refuse it as damaged), and it is not kept (keep: a
// takeover to finish). A lease kept for digests is given back when they
// are written.
func (v *vmLeases) giveBack(name string, keep bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.refs[name]--; v.refs[name] > 0 {
		return
	}
	delete(v.refs, name)
	delete(v.failed, name)
	l, ok := v.held[name]
	if !ok || keep {
		return
	}
	if in := v.m.procs.instance(name); in != nil && alive(in) {
		return // its VMM holds it on; the operation that stops it gives it back
	}
	if v.m.seal.busyUnder(storage.VMDir(name)) {
		v.refs[name]++ // the digests' hold
		select {
		case <-v.m.digestsEnd: // kept, for the next start's digests
		default:
			v.afterDigest.Go(func() { v.afterDigests(name) })
		}
		return
	}
	if v.m.seal.unsealedUnder(storage.VMDir(name)) {
		// Digests a seal left missing: kept, so that the next start of
		// this host claims the VM and writes them (sealPending).
		v.refs[name]++
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := v.m.cfg.Leases.Release(ctx, l); err != nil && !errors.Is(err, registry.ErrLeaseLost) {
		// Still held and renewed: given back by watchLapsed, or by the
		// next operation on the VM here.
		v.m.log.Warn("den: give back a vm's lease: tried again later", "vm", name, "err", err)
		v.failed[name] = true
		return
	}
	delete(v.held, name)
}

// giveBackFailed gives back again the leases whose giving back failed,
// unless an operation holds them meanwhile; it stops at the first that
// fails again (the registry still away: each try holds the leases' lock
// for up to its bound).
func (v *vmLeases) giveBackFailed() {
	v.mu.Lock()
	names := slices.Collect(maps.Keys(v.failed))
	v.mu.Unlock()
	for _, name := range names {
		v.mu.Lock()
		try := v.failed[name] && v.refs[name] == 0
		if try {
			v.refs[name]++ // giveBack's, below
		}
		v.mu.Unlock()
		if !try {
			continue
		}
		v.giveBack(name, false)
		v.mu.Lock()
		again := v.failed[name]
		v.mu.Unlock()
		if again {
			return
		}
	}
}

// endDigests ends the digests under way (at their next extent). Under
// the leases' lock: no lease is kept for digests after it (giveBack).
func (v *vmLeases) endDigests() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.m.digestsOnce.Do(func() { close(v.m.digestsEnd) })
}

// afterDigests gives name's lease back (giveBack) once no digests of its
// snapshots are being written. A stop lets them finish within its bound
// (Close); with digests still to write after that, it stays held: the
// next start of this host writes them and gives it back; another host
// takes it over only if this one does not come back within the lease.
func (v *vmLeases) afterDigests(name string) {
	for v.m.seal.busyUnder(storage.VMDir(name)) {
		select {
		case <-v.m.digestsEnd:
			if v.m.seal.busyUnder(storage.VMDir(name)) {
				return
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	if v.m.seal.unsealedUnder(storage.VMDir(name)) {
		return // cut short or failed: kept (giveBack)
	}
	v.giveBack(name, false)
}

// pending is the host a takeover of name that a crash cut short took
// the VM from ("" for none).
func (v *vmLeases) pending(name string) string {
	b, err := os.ReadFile(v.m.state.Takeover(name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// takeOver deals with a VM whose lease this host took from host from,
// which let it lapse: that host is lost, and whatever it did with the
// VM was cut short. A VM it was creating is rolled back, one it was
// removing is removed; any other VM has what the host's operations left
// swept (as a start does) and is recorded lost, with a disk
// file of its own (setAsideLateWrites) and a reason that says what is
// left. Its sleep's memory is not restored: the lost host may have
// woken it, and its guest written the disk, before it was lost. The
// work is marked in the state dir first, so that a crash in the middle
// leaves it for the next lock of the VM.
func (v *vmLeases) takeOver(ctx context.Context, name, from string) error {
	mark := v.m.state.Takeover(name)
	if err := os.MkdirAll(filepath.Dir(mark), 0o700); err != nil {
		return fmt.Errorf("vm %q: take over from host %q: %w", name, from, err)
	}
	if err := atomicfile.Write(mark, []byte(from+"\n"), 0o600); err != nil {
		return fmt.Errorf("vm %q: take over from host %q: %w", name, from, err)
	}
	vm, err := v.m.db.GetVM(ctx, name)
	switch {
	case errors.Is(err, registry.ErrNotFound):
	case err != nil:
		return fmt.Errorf("vm %q: take over from host %q: %w", name, from, err)
	case vm.State == registry.StateCreating || vm.State == registry.StateDeleting:
		v.m.log.Warn("den: finishing a vm's creation or removal that a lost host began", "vm", name, "from", from, "state", vm.State)
		if err := v.m.startup.dropUnfinished(ctx, vm); err != nil {
			return fmt.Errorf("vm %q: take over from host %q: %w", name, from, err)
		}
	default:
		// What the lost host's operations left half done is swept first,
		// as that host's own start would have: once the VM's lease was
		// given back, that start no longer looks at it (claim).
		v.m.startup.sweepCheckpoints(ctx, name)
		v.m.startup.sweepSuspend(ctx, vm)
		if vm, err = v.m.db.GetVM(ctx, name); err != nil {
			return fmt.Errorf("vm %q: take over from host %q: %w", name, from, err)
		}
		v.m.integrity.sealPending(ctx, vm)
		reason := v.lostReason(ctx, vm, from, v.setAsideLateWrites(ctx, name, from))
		if _, err := v.m.db.UpdateVMIf(ctx, name, vm.Generation, func(r *registry.VM) error {
			r.State, r.Reason = registry.StateLost, reason
			return nil
		}); err != nil {
			return fmt.Errorf("vm %q: take over from host %q: %w", name, from, err)
		}
		v.m.log.Warn("den: took over a vm of a lost host", "vm", name, "from", from, "was", vm.State)
		if sp, err := decodeSpec(vm); err == nil && sp.RestartOnHostLoss {
			// Once the caller lets the VM go (a caller that boots it
			// anyway finds it running).
			v.m.inBackground(func(ctx context.Context) {
				v.m.log.Info("den: booting a vm of a lost host here, as its policy asks (on host loss: restart)", "vm", name, "from", from)
				if _, err := v.m.ensureRunning(ctx, name, "", false, true); err != nil {
					v.m.log.Warn("den: boot a vm of a lost host", "vm", name, "err", err)
				}
			})
		}
	}
	if err := os.Remove(mark); err != nil && !errors.Is(err, fs.ErrNotExist) {
		v.m.log.Warn("den: takeover done, but its mark stays", "vm", name, "err", err)
	}
	return nil
}

// lostReason is the record's reason for a VM taken over from a lost
// host: the host, what the VM was, what is left of it, and what became
// of its disk.
func (v *vmLeases) lostReason(ctx context.Context, vm registry.VM, from, disk string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "lost with host %s (it stopped renewing its leases)", from)
	if vm.State == registry.StateRunning {
		fmt.Fprintf(&b, ", where it ran (last active %s)", vm.LastActive.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(&b, ", which was working on it (%s)", vm.State)
	}
	if vm.State == registry.StateSleeping {
		b.WriteString("; its sleep's memory is not restored (that host may have woken it)")
	}
	if cps, err := v.m.db.ListCheckpoints(ctx, vm.Name); err == nil && len(cps) > 0 {
		cp := cps[len(cps)-1]
		fmt.Fprintf(&b, "; its newest checkpoint is %s, from %s ago", cp.ID, time.Since(cp.CreatedAt).Round(time.Second))
	}
	b.WriteString("; ")
	b.WriteString(disk)
	return b.String()
}

// setAsideLateWrites gives a VM that ran on host from, whose lease this
// host took over, a disk file of its own: a clone of the disk as it is,
// renamed over it. Writes that host's volume client still holds for the
// old file, committed if ever once it reaches the metadata engine again,
// then land in the old file, which nothing opens again, never in the disk
// this host boots. It says what became of the disk.
func (v *vmLeases) setAsideLateWrites(ctx context.Context, name, from string) string {
	tmp := storage.VMDir(name).Join(takeoverDisk)
	_ = v.m.vol.Remove(ctx, tmp) // a takeover a crash cut short
	err := v.m.vol.Clone(ctx, storage.VMDisk(name), tmp)
	if err == nil {
		err = v.m.vol.Rename(ctx, tmp, storage.VMDisk(name))
	}
	if err != nil {
		_ = v.m.vol.Remove(ctx, tmp)
		v.m.log.Error("den: a vm taken over from another host keeps its disk file: writes that host may still commit can reach it", "vm", name, "from", from, "err", err)
		return fmt.Sprintf("its disk file could not be cloned afresh (%v), so writes %s may still commit can reach it", err, from)
	}
	return fmt.Sprintf("its disk was cloned afresh, setting aside writes %s may still commit; it boots from that disk when next used", from)
}

// takeoverDisk is the clone setAsideLateWrites renames over a VM's disk.
const takeoverDisk = "disk-takeover"

// takeOverLapsed takes over the VM whose lease l lapsed, if no other
// host did first, with a wait of its own for the VM's lock.
func (v *vmLeases) takeOverLapsed(l registry.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultLockWait)
	defer cancel()
	unlock, err := v.m.locks.lockName(ctx, l.VM, "take over from a lost host")
	if err != nil {
		v.m.log.Info("den: a vm of a lost host was not taken over here", "vm", l.VM, "from", l.Host, "err", err)
		return
	}
	unlock()
}

// watchLapsed takes over, every Leases.Every, the VMs whose host let
// their lease lapse, and gives back the leases whose giving back failed,
// until the Manager closes. Every live host looks;
// the lease decides which one takes each VM.
func (v *vmLeases) watchLapsed() {
	ls := v.m.cfg.Leases
	t := time.NewTicker(ls.Every())
	defer t.Stop()
	for {
		select {
		case <-v.m.closed:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), DefaultLockWait)
		lapsed, err := ls.Lapsed(ctx)
		cancel()
		if err != nil {
			v.m.log.Warn("den: look for vms of lost hosts", "err", err)
		}
		for _, l := range lapsed {
			if !strings.HasPrefix(l.VM, "@") { // a host's own lease is no VM's
				v.takeOverLapsed(l)
			}
		}
		v.giveBackFailed()
	}
}
