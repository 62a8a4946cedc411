package machine

import (
	"context"
	"errors"
	"time"

	"github.com/denhq/den/registry"
)

// DefaultActivitySave is how often, at most, a running VM's last
// activity is written to the registry.
const DefaultActivitySave = 30 * time.Second

// A VM's last activity (sessions admitted and released, the idle
// monitor's Touch when the guest is busy) is kept in memory, on the hot
// path, and written to the registry in batches: every ActivitySave for
// the VMs whose activity is newer than their record's, when a VM goes to
// sleep (sleep.go), and when the Manager closes. A daemon that starts
// again reads it back (adopt), so den ls and the idle policy see how
// long a VM has really been idle. The write (registry.TouchVM) only
// raises last_active and takes no new generation: it never makes an
// operation's compare-and-set stale.

// startActivitySaver starts writing last activity every ActivitySave
// until stopActivitySaver.
func (ac *lastActivity) startActivitySaver() {
	every := ac.m.cfg.ActivitySave
	if every <= 0 {
		every = DefaultActivitySave
	}
	ac.m.actWG.Add(1)
	go func() {
		defer ac.m.actWG.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ac.m.closed:
				return
			case <-t.C:
				ac.saveActivity(context.Background())
			}
		}
	}()
}

// stopActivitySaver ends the saver (m.closed is closed) and writes what
// it has not written yet.
func (ac *lastActivity) stopActivitySaver() {
	ac.m.actWG.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ac.saveActivity(ctx)
}

// saveActivity writes the last activity of every open instance whose
// activity is newer than its record's. Instances being closed (sleep,
// restore, rm) are their operation's to record.
func (ac *lastActivity) saveActivity(ctx context.Context) {
	ac.m.mu.Lock()
	insts := make([]*instance, 0, len(ac.m.instances))
	for _, in := range ac.m.instances {
		insts = append(insts, in)
	}
	ac.m.mu.Unlock()
	now := time.Now()
	for _, in := range insts {
		if !in.isOpen() {
			continue
		}
		t, ok := in.unsaved(now)
		if !ok {
			continue
		}
		if err := ac.m.db.TouchVM(ctx, in.name, t.UTC()); err != nil {
			if !errors.Is(err, registry.ErrNotFound) {
				ac.m.log.Warn("den: last activity not saved", "vm", in.name, "err", err)
			}
			continue
		}
		in.saved(t)
	}
}

// activity saves running VMs' last activity to the registry, at most every
// Config.ActivitySave (activity.go).
type lastActivity struct{ m *Manager }
