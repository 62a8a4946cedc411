package machine

import (
	"context"
	"testing"
	"time"
)

// quietManager is a Manager with what the VM locks need, nothing else.
func quietManager(t *testing.T) *Manager {
	return &Manager{state: StateDir(t.TempDir()), holders: map[string]holder{}, waiters: map[string]chan struct{}{}, closed: make(chan struct{})}
}

// TestWaitQuiet: background work waits while an operation holds a VM,
// then until none has for the settle time, never past its bound, and
// not after its context ends.
func TestWaitQuiet(t *testing.T) {
	m := quietManager(t)
	ctx := context.Background()

	start := time.Now()
	m.waitQuiet(ctx, time.Hour, time.Minute) // nothing ever held a VM
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a host never busy: waited %v", d)
	}

	unlock, err := m.tryLockVM("box", "test")
	if err != nil || unlock == nil {
		t.Fatalf("lock: %v", err)
	}
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		released <- time.Now()
		unlock()
	}()
	const settle = 300 * time.Millisecond
	m.waitQuiet(ctx, settle, time.Minute)
	at := <-released
	if d := time.Since(at); d < settle {
		t.Fatalf("returned %v after the release, before the settle time (%v)", d, settle)
	}

	unlock, err = m.tryLockVM("box", "test")
	if err != nil || unlock == nil {
		t.Fatalf("lock again: %v", err)
	}
	defer unlock()
	start = time.Now()
	m.waitQuiet(ctx, 0, 200*time.Millisecond)
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("a held vm: returned after %v, before the bound", d)
	}

	cctx, cancel := context.WithCancel(ctx)
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	done := make(chan struct{})
	go func() {
		m.waitQuiet(cctx, 0, time.Hour)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("waitQuiet did not end with its context")
	}
}
