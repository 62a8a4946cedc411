package machine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// lockVM takes the VM's file lock, waiting boundedly by ctx: one
// operation at a time per VM, across goroutines and processes.
func (m *Manager) lockVM(ctx context.Context, name string) (func(), error) {
	path := m.state.Lock(name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock vm %q: %w", name, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock vm %q: %w", name, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			m.setBusy(name, 1)
			return func() {
				m.setBusy(name, -1)
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		if err != unix.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock vm %q: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("vm %q is busy with another operation: %w", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// setBusy counts operations holding a VM's lock.
func (m *Manager) setBusy(name string, d int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy[name] += d
	if m.busy[name] <= 0 {
		delete(m.busy, name)
	}
}

// isBusy says whether an operation holds the VM's lock: its record and
// processes are then in flux, and only that operation may reconcile them.
func (m *Manager) isBusy(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.busy[name] > 0
}
