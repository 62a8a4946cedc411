package machine

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/registry"
)

// Session is a claim on a running VM's agent connection: the VM counts as
// active until Release.
type Session struct {
	// Conn opens channels on the agent (sshproxy.Opener).
	Conn ssh.Conn
	// Done is closed when the agent connection breaks (the VM stopped).
	Done <-chan struct{}
	in   *instance
	done bool
}

// Release ends the session's claim on the VM.
func (s *Session) Release() {
	if s.done {
		return
	}
	s.done = true
	s.in.actMu.Lock()
	s.in.sessions--
	s.in.lastAct = time.Now()
	s.in.actMu.Unlock()
}

// Open returns a session on the VM's agent, starting the VM first if it
// is stopped, and waiting for it. owner, when set, must own the VM.
func (m *Manager) Open(ctx context.Context, name, owner string) (*Session, error) {
	in, err := m.ensureRunning(ctx, name, owner)
	if err != nil {
		return nil, err
	}
	// Counted before the dial, so that a sleep starting now refuses.
	in.actMu.Lock()
	in.sessions++
	in.lastAct = time.Now()
	in.actMu.Unlock()
	s := &Session{in: in}
	c, err := m.agentClient(ctx, in)
	if err != nil {
		s.Release()
		return nil, fmt.Errorf("vm %q: %w", name, err)
	}
	s.Conn, s.Done = c.SSH(), c.Done()
	return s, nil
}

// ensureRunning returns the running instance of a VM, booting a stopped
// VM first.
func (m *Manager) ensureRunning(ctx context.Context, name, owner string) (*instance, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	if owner != "" && vm.Owner != owner {
		return nil, fmt.Errorf("no vm named %q: %w", name, ErrNotFound)
	}
	// The fast path: running, and no operation (sleep, restore) under way.
	if in := m.instance(name); in != nil && alive(in) && !m.isBusy(name) {
		return in, nil
	}
	unlock, err := m.lockVM(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	vm, err = m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	if in := m.instance(name); in != nil && alive(in) {
		return in, nil
	}
	switch vm.State {
	case registry.StateRunning, registry.StateStopped:
		if err := m.start(ctx, vm); err != nil {
			return nil, err
		}
	case registry.StateSleeping:
		if err := m.wakeLocked(ctx, vm); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("vm %q is %s: %w", name, vm.State, ErrConflict)
	}
	in := m.instance(name)
	if in == nil {
		return nil, fmt.Errorf("vm %q did not start", name)
	}
	return in, nil
}

// start cold-boots a stopped VM from its disk.
func (m *Manager) start(ctx context.Context, vm registry.VM) error {
	sp, err := decodeSpec(vm)
	if err != nil {
		return err
	}
	if vm.State == registry.StateRunning {
		m.markStopped(vm.Name, "vmm process not found")
	}
	if sp.Restoring != "" {
		cp, err := m.getCheckpoint(ctx, vm.Name, sp.Restoring)
		if err != nil {
			return fmt.Errorf("finish the interrupted restore of vm %q: %w", vm.Name, err)
		}
		return m.finishRestore(ctx, vm, cp, func(string) {})
	}
	if err := m.boot(ctx, vm, sp); err != nil {
		return fmt.Errorf("start vm %q: %w", vm.Name, err)
	}
	_, err = m.db.UpdateVM(ctx, vm.Name, func(v *registry.VM) error {
		v.State = registry.StateRunning
		v.Reason = ""
		v.LastActive = time.Now().UTC()
		return nil
	})
	return err
}
