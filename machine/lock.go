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
			return func() {
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
