package machine

import (
	"context"
	"testing"
	"time"
)

// quietManager is a Manager with what the VM locks need, nothing else.
func quietManager(t *testing.T) *Manager {
	return wire(&Manager{state: StateDir(t.TempDir()), holders: map[string]holder{}, waiters: map[string]chan struct{}{}, closed: make(chan struct{})})
}

// TestWaitQuiet: background work waits while an operation holds a VM,
// then until none has for the settle time, never past its bound, and
// not after its context ends.
func TestWaitQuiet(t *testing.T) {
	m := quietManager(t)
	ctx := context.Background()

	start := time.Now()
	m.locks.waitQuiet(ctx, time.Hour, time.Minute) // nothing ever held a VM
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a host never busy: waited %v", d)
	}

	unlock, err := m.locks.tryLockVM("box", "test")
	if err != nil || unlock == nil {
		t.Fatalf("lock: %v", err)
	}
	const settle = 300 * time.Millisecond
	done := make(chan time.Time, 1)
	go func() {
		m.locks.waitQuiet(ctx, settle, time.Minute)
		done <- time.Now()
	}()
	select {
	case <-done:
		t.Fatal("returned while a vm was held")
	default:
	}
	released := time.Now()
	unlock()
	select {
	case at := <-done:
		if d := at.Sub(released); d < settle {
			t.Fatalf("returned %v after the release, before the settle time (%v)", d, settle)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("waitQuiet did not return after the release")
	}

	unlock, err = m.locks.tryLockVM("box", "test")
	if err != nil || unlock == nil {
		t.Fatalf("lock again: %v", err)
	}
	defer unlock()
	start = time.Now()
	m.locks.waitQuiet(ctx, 0, 200*time.Millisecond)
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("a held vm: returned after %v, before the bound", d)
	}

	cctx, cancel := context.WithCancel(ctx)
	ended := make(chan struct{})
	go func() {
		m.locks.waitQuiet(cctx, 0, time.Hour)
		close(ended)
	}()
	cancel()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("waitQuiet did not end with its context")
	}
}
