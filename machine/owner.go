package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
)

// DefaultLockWait bounds how long an operation waits for a VM that
// another operation holds.
const DefaultLockWait = 2 * time.Minute

// holder is an operation holding a VM's lock in this process.
type holder struct {
	op    string
	since time.Time
}

// errClosing refuses operations once the Manager is closing.
var errClosing = fmt.Errorf("den is shutting down: %w", ErrBusy)

type ownerKey struct{}

// AsOwner says that the operations run with ctx act for the user owner:
// a VM that is not owner's is "not found" to them, checked under the
// VM's lock, where its owner cannot change (a check before the lock
// could pass for a VM that is removed and made again by another user
// before the lock is taken). "" (an admin) acts on every VM.
func AsOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// lockVM takes the lock of an existing VM (lockName) for the operation
// op, refusing as not found a VM that is not the owner's AsOwner named.
func (lk *locks) lockVM(ctx context.Context, name, op string) (func(), error) {
	unlock, err := lk.lockName(ctx, name, op)
	if err != nil {
		return nil, err
	}
	if owner, _ := ctx.Value(ownerKey{}).(string); owner != "" {
		if vm, err := lk.m.db.GetVM(ctx, name); err == nil && vm.Owner != owner {
			unlock()
			return nil, fmt.Errorf("no vm named %q: %w", name, ErrNotFound)
		}
	}
	return unlock, nil
}

// lockName makes the caller the owner of the VM's state until the returned
// func is called: one operation at a time per VM, across goroutines (an
// in-process table that also says who holds it) and processes (a file
// lock). It waits at most until ctx ends or Config.LockWait passes, and a
// refusal names the holder: vm "box" is busy: checkpoint since 12s.
// Create and fork take a new name's lock with it, whoever has the name.
// On a cluster host it takes the VM's lease too (lease.go): the lock
// then holds across hosts.
func (lk *locks) lockName(ctx context.Context, name, op string) (func(), error) {
	unlock, err := lk.lockLocal(ctx, name, op)
	if err != nil {
		return nil, err
	}
	return lk.leased(ctx, name, unlock)
}

// leased adds, on a cluster host, the VM's lease to a local lock's
// unlock (lease.go); a refused lease lets the local lock go.
func (lk *locks) leased(ctx context.Context, name string, unlock func()) (func(), error) {
	release, err := lk.m.leases.take(ctx, name)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() { release(); unlock() }, nil
}

// lockLocal is lockName on this host alone.
func (lk *locks) lockLocal(ctx context.Context, name, op string) (func(), error) {
	wait := lk.m.cfg.LockWait
	if wait <= 0 {
		wait = DefaultLockWait
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	defer phase.Begin(ctx, "lock")()
	for {
		unlock, err := lk.tryLockVM(name, op)
		if err != nil || unlock != nil {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", lk.busyLine(name), errors.Join(ErrBusy, ctx.Err()))
		case <-clientGone(ctx):
			return nil, fmt.Errorf("%s: the client went away while waiting: %w", lk.busyLine(name), ErrBusy)
		case <-deadline.C:
			return nil, fmt.Errorf("%s (waited %s): %w", lk.busyLine(name), wait, ErrBusy)
		case <-lk.released(name):
		case <-time.After(50 * time.Millisecond): // a holder in another process
		}
	}
}

type clientKey struct{}

// WithClient ties an operation's context to the client that asked for
// it: the operation itself runs to its end (or rolls back) whatever the
// client does, but a wait for a VM's lock ends when the client goes
// away, since nothing was started yet.
func WithClient(ctx, client context.Context) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

// clientGone is closed when the operation's client went away; nil when
// there is none.
func clientGone(ctx context.Context) <-chan struct{} {
	if c, ok := ctx.Value(clientKey{}).(context.Context); ok {
		return c.Done()
	}
	return nil
}

// tryLockVM takes the VM's lock if nobody holds it; (nil, nil) when
// somebody does.
func (lk *locks) tryLockVM(name, op string) (func(), error) {
	lk.m.mu.Lock()
	if err := lk.m.host.hostRefusesLocked(name, op); err != nil {
		lk.m.mu.Unlock()
		return nil, err
	}
	select {
	case <-lk.m.closed:
		lk.m.mu.Unlock()
		return nil, fmt.Errorf("vm %q: %w", name, errClosing)
	default:
	}
	if _, held := lk.m.holders[name]; held {
		lk.m.mu.Unlock()
		return nil, nil
	}
	lk.m.holders[name] = holder{op: op, since: time.Now()}
	lk.m.ops.Add(1)
	lk.m.mu.Unlock()
	drop := func() {
		lk.m.mu.Lock()
		delete(lk.m.holders, name)
		lk.m.lastRelease = time.Now()
		if ch, ok := lk.m.waiters[name]; ok {
			close(ch)
			delete(lk.m.waiters, name)
		}
		lk.m.mu.Unlock()
		lk.m.ops.Done()
	}
	f, err := lk.openLockFile(name)
	if err != nil {
		drop()
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		drop()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil // held by another process
		}
		return nil, fmt.Errorf("lock vm %q: %w", name, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			f.Close()
			drop()
		})
	}, nil
}

func (lk *locks) openLockFile(name string) (*os.File, error) {
	path := lk.m.state.Lock(name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock vm %q: %w", name, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock vm %q: %w", name, err)
	}
	return f, nil
}

// released is closed when the VM's current holder in this process lets
// go; nil (never ready) when the holder is another process.
func (lk *locks) released(name string) <-chan struct{} {
	lk.m.mu.Lock()
	defer lk.m.mu.Unlock()
	if _, held := lk.m.holders[name]; !held {
		return nil
	}
	ch, ok := lk.m.waiters[name]
	if !ok {
		ch = make(chan struct{})
		lk.m.waiters[name] = ch
	}
	return ch
}

// busyLine says who holds a VM: `vm "box" is busy: checkpoint since 12s`.
func (lk *locks) busyLine(name string) string {
	lk.m.mu.Lock()
	h, ok := lk.m.holders[name]
	lk.m.mu.Unlock()
	if !ok {
		return fmt.Sprintf("vm %q is busy: another process holds its lock", name)
	}
	return fmt.Sprintf("vm %q is busy: %s since %s", name, h.op, time.Since(h.since).Round(time.Second))
}

// Op names what holds a VM, for den info: "" when nothing does.
func (m *Manager) Op(name string) (string, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.holders[name]
	if !ok {
		return "", 0
	}
	return h.op, time.Since(h.since)
}

// reconcileVM is how a read that found a record disagreeing with reality
// asks the VM's owner to look: if no operation holds the VM, it takes the
// lock, re-reads the record and re-checks the VMM, and only then records
// what it finds, as a compare-and-set on the generation it read. If an
// operation holds the VM, the record is that operation's to write and is
// returned as it is. Reads themselves never write.
func (lk *locks) reconcileVM(ctx context.Context, name string) (registry.VM, error) {
	unlock, err := lk.tryLockVM(name, "reconcile")
	if err != nil {
		return registry.VM{}, err
	}
	if unlock == nil {
		return lk.m.get(ctx, name)
	}
	// On a cluster host, a VM is this host's to reconcile only while it
	// holds its lease: another host may run it.
	if unlock, err = lk.leased(ctx, name, unlock); err != nil {
		return lk.m.get(ctx, name)
	}
	defer unlock()
	return lk.reconcileLocked(ctx, name)
}

// reconcileLocked checks a VM's record against its VMM; the caller holds
// the lock.
func (lk *locks) reconcileLocked(ctx context.Context, name string) (registry.VM, error) {
	vm, err := lk.m.get(ctx, name)
	if err != nil || vm.State != registry.StateRunning {
		return vm, err
	}
	in := lk.m.procs.instance(name)
	if in != nil && alive(in) {
		return vm, nil
	}
	reason := "vmm process not found"
	if in != nil {
		reason = exitReason(in)
		lk.m.procs.dropInstance(name)
		in.closeAgent()
	}
	lk.m.log.Warn("den: vm found stopped", "vm", name, "reason", reason)
	return lk.m.db.UpdateVMIf(ctx, name, vm.Generation, func(v *registry.VM) error {
		v.State, v.Reason = registry.StateStopped, reason
		return nil
	})
}

// exitReason says how a VMM ended, with the console's last words.
func exitReason(in *instance) string {
	reason := "vmm exited"
	if err := in.hv.ExitErr(); err != nil {
		reason = "vmm exited: " + err.Error()
	}
	return reason
}

// waitQuiet waits until no operation holds a VM and none has for settle,
// or until limit has passed or ctx ends. Background work that competes
// with operations for the host starts once operations pause: a
// checkpoint's sizes, asked of JuiceFS right after it was taken, slowed
// the restore that came next by a fifth (the volume's clones and the
// VMM's start waited behind the chunk lists it read).
func (lk *locks) waitQuiet(ctx context.Context, settle, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		lk.m.mu.Lock()
		busy, since := len(lk.m.holders) > 0, time.Since(lk.m.lastRelease)
		lk.m.mu.Unlock()
		if !busy && since >= settle {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		wait := quietPoll
		if !busy {
			wait = settle - since
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(wait, left)):
		}
	}
}

// quietPoll is how often waitQuiet looks again while a VM is held.
const quietPoll = 50 * time.Millisecond

// locks are the VMs' locks: one operation at a time per VM, across
// goroutines and processes, and who holds each (owner.go).
type locks struct{ m *Manager }
