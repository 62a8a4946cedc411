package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"
)

// EventKind says what happened to a volume's mount.
type EventKind string

const (
	// EventLost: the mount process exited or stopped answering. Files open
	// on the volume (VM disks) fail from now on: reopen them after
	// EventRemounted.
	EventLost EventKind = "lost"
	// EventRemounted: a fresh mount is up after EventLost.
	EventRemounted EventKind = "remounted"
	// EventRemountFailed: one remount attempt failed; the supervisor keeps
	// trying with backoff.
	EventRemountFailed EventKind = "remount-failed"
	// EventUnmounted: Unmount took the volume down.
	EventUnmounted EventKind = "unmounted"
)

// Event is a change of a volume's mount, sent to subscribers.
type Event struct {
	Kind   EventKind
	Volume string
	Time   time.Time
	Detail string
	Err    error
}

func (e Event) String() string {
	s := fmt.Sprintf("volume %q %s", e.Volume, e.Kind)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Subscribe returns a channel of the volume's events and a function that
// ends the subscription. Events are never blocked on: a subscriber that
// falls 32 events behind misses the newest ones (logged).
func (v *JuiceFS) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, 32)
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		close(ch)
		return ch, func() {}
	}
	v.subs[ch] = struct{}{}
	v.mu.Unlock()
	return ch, func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if _, ok := v.subs[ch]; ok {
			delete(v.subs, ch)
			close(ch)
		}
	}
}

func (v *JuiceFS) emit(e Event) {
	e.Volume = v.cfg.Name
	e.Time = time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	for ch := range v.subs {
		select {
		case ch <- e:
		default:
			slog.Warn("storage: subscriber too slow, event dropped", "event", e.String())
		}
	}
}

// supervise watches the mount until Close: the exit of the mount process is
// noticed at once, a hang after opts.failures probes in a row; either way
// the mount is torn down and remounted, with backoff, until it is back.
func (v *JuiceFS) supervise() {
	defer close(v.done)
	tick := time.NewTicker(v.opts.interval)
	defer tick.Stop()
	failed := 0
	var firstErr error
	for {
		var exited chan struct{}
		v.mu.Lock()
		p := v.proc
		v.mu.Unlock()
		if p != nil {
			exited = p.exited
		}
		var lost error
		select {
		case <-v.stop:
			return
		case <-exited:
			lost = v.exitReason(p)
		case <-tick.C:
			_, err := v.probe.run(context.Background(), v.cfg.MountPoint, v.opts.timeout)
			if err == nil {
				failed, firstErr = 0, nil
				continue
			}
			if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
				// The FUSE connection is gone for good: no point waiting.
				// When the mount process died, its exit, which the
				// probe may see first, says more.
				lost = fmt.Errorf("mount gone: %w", err)
				select {
				case <-exited:
					lost = v.exitReason(p)
				case <-v.stop:
					return
				case <-time.After(time.Second):
				}
				break
			}
			failed++
			if firstErr == nil {
				firstErr = err
			}
			slog.Warn("storage: mount probe failed", "volume", v.cfg.Name, "failures", failed, "err", err)
			if failed < v.opts.failures {
				continue
			}
			lost = fmt.Errorf("mount not answering (%d probes in a row, first: %w)", failed, firstErr)
		}
		failed, firstErr = 0, nil
		slog.Error("storage: mount lost", "volume", v.cfg.Name, "err", lost)
		v.emit(Event{Kind: EventLost, Err: lost})
		if !v.remount() {
			return
		}
	}
}

// exitReason says why a mount was lost whose process p exited.
func (v *JuiceFS) exitReason(p *mountProc) error {
	return fmt.Errorf("mount process %d exited (%v): %s", p.pid, p.err, v.logTail(2))
}

// remount tears the lost mount down and mounts again until it works or the
// volume is closed (false).
func (v *JuiceFS) remount() bool {
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		mi, _, _ := findMount(v.cfg.MountPoint)
		v.teardown(mi)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-v.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := v.mount(ctx)
		cancel()
		if err == nil {
			v.emit(Event{Kind: EventRemounted, Detail: fmt.Sprintf("attempt %d", attempt)})
			return true
		}
		slog.Error("storage: remount failed", "volume", v.cfg.Name, "attempt", attempt, "err", err)
		v.emit(Event{Kind: EventRemountFailed, Detail: fmt.Sprintf("attempt %d", attempt), Err: err})
		select {
		case <-v.stop:
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, v.opts.backoffMax)
	}
}

// Close stops supervising and ends the subscriptions (their channels are
// closed). The mount stays up (a daemon restart must not take VM disks
// away); use Unmount to take it down.
func (v *JuiceFS) Close() error {
	v.stopSupervising()
	v.mu.Lock()
	defer v.mu.Unlock()
	for ch := range v.subs {
		delete(v.subs, ch)
		close(ch)
	}
	return nil
}

// stopSupervising stops the supervisor goroutine (idempotent).
func (v *JuiceFS) stopSupervising() {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.closed = true
	v.mu.Unlock()
	close(v.stop)
	<-v.done
}
