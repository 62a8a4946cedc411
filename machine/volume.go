package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/denhq/den/storage"
)

// watchVolume acts on the volume's mount dying: a VMM's open disk is a
// file on the dead mount and never comes back (the supervisor remounts
// the volume for new opens only), so VMs must not run on against it.
func (m *Manager) watchVolume() {
	events, stop := m.vol.Subscribe()
	defer stop()
	for {
		select {
		case <-m.closed:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind == storage.EventLost || ev.Kind == storage.EventRemounted {
				m.volumeLost(ev)
			}
		}
	}
}

// volumeLost stops every VM whose VMM opened its disk before the event:
// paused first, so the guest sees no more failing writes, then stopped,
// and recorded as stopped with what happened. The next access boots it
// from its disk on the new mount (its memory was on the dead one's
// side of the outage: a suspend slot would be older than the disk).
func (m *Manager) volumeLost(ev storage.Event) {
	m.mu.Lock()
	var hit []*instance
	for _, in := range m.instances {
		if in.started.Before(ev.Time) {
			hit = append(hit, in)
		}
	}
	m.mu.Unlock()
	if len(hit) == 0 {
		return
	}
	reason := fmt.Sprintf("storage volume %s at %s (%v): the vm was stopped so that it does not run on a dead disk; it boots from its disk when next used",
		ev.Kind, ev.Time.UTC().Format(time.RFC3339), ev.Err)
	if ev.Err == nil {
		reason = fmt.Sprintf("storage volume %s at %s: the vm was stopped so that it does not run on a dead disk; it boots from its disk when next used",
			ev.Kind, ev.Time.UTC().Format(time.RFC3339))
	}
	for _, in := range hit {
		// Pause at once, before waiting for the VM's lock.
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = in.hv.Pause(pctx)
		cancel()
		m.stopLost(in, reason)
	}
}

// stopLost stops one VM hit by a volume loss, as its owner.
func (m *Manager) stopLost(in *instance, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultLockWait)
	defer cancel()
	unlock, err := m.lockVM(ctx, in.name, "stop after volume loss")
	if err != nil {
		m.log.Warn("den: stop vm after volume loss", "vm", in.name, "err", err)
		return
	}
	defer unlock()
	if m.instance(in.name) != in {
		return // an operation replaced or stopped it meanwhile
	}
	m.log.Warn("den: stopping vm: its disk was on the lost mount", "vm", in.name)
	in.close(true)
	m.stopInstance(ctx, in, false)
	m.recordStopped(ctx, in.name, reason)
}
