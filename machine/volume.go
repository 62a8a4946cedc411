package machine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// watchVolume acts on the volume's mount dying: a VMM's open disk is a
// file on the dead mount and never comes back (the supervisor remounts
// the volume for new opens only), so VMs must not run on against it.
func (vg *volumeGuard) watchVolume() {
	events, stop := vg.m.vol.Subscribe()
	defer stop()
	for {
		select {
		case <-vg.m.closed:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind == storage.EventLost || ev.Kind == storage.EventRemounted {
				vg.volumeLost(ev)
			}
		}
	}
}

// volumeLost stops every VM whose VMM opened its disk before the event:
// all paused at once, so no guest sees more failing writes, then each
// stopped by its owner and recorded as stopped with what happened. The
// next access boots it from its disk on the new mount (a suspend slot
// would be older than the disk). A VMM an operation is starting now is
// caught when the operation publishes it (setInstance).
func (vg *volumeGuard) volumeLost(ev storage.Event) {
	reason := fmt.Sprintf("storage volume %s at %s", ev.Kind, ev.Time.UTC().Format(time.RFC3339))
	if ev.Err != nil {
		reason += fmt.Sprintf(" (%v)", ev.Err)
	}
	reason += ": the vm was stopped so that it does not run on a dead disk; it boots from its disk when next used"
	vg.m.mu.Lock()
	// The VMMs at risk opened their disk on the mount that died. After a
	// remount that is those started before the loss: one started since
	// could open its disk only on the new mount (the dead one answers
	// nothing), even a moment before the remount is announced.
	cut := ev.Time
	if ev.Kind == storage.EventRemounted && !vg.m.volumeLostAt.IsZero() {
		cut = vg.m.volumeLostAt
	} else if ev.Time.After(vg.m.volumeLostAt) {
		vg.m.volumeLostAt, vg.m.volumeLostWhy = ev.Time, reason
	}
	var hit []*instance
	for _, in := range vg.m.instances {
		if in.started.Before(cut) {
			hit = append(hit, in)
		}
	}
	vg.m.mu.Unlock()
	var paused sync.WaitGroup
	for _, in := range hit {
		paused.Add(1)
		go func() {
			defer paused.Done()
			pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = in.hv.Pause(pctx)
		}()
	}
	paused.Wait()
	for _, in := range hit {
		go vg.stopLost(in, reason)
	}
}

// stopLost stops one VM hit by a volume loss, as its owner: it waits for
// the VM's lock for as long as it takes (an operation in flight on a dead
// disk fails soon), until the Manager closes.
func (vg *volumeGuard) stopLost(in *instance, reason string) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultLockWait)
		unlock, err := vg.m.locks.lockVM(ctx, in.name, "stop after volume loss")
		cancel()
		if err == nil {
			defer unlock()
			break
		}
		select {
		case <-vg.m.closed:
			return
		default:
		}
		vg.m.log.Warn("den: stop vm after volume loss: still waiting", "vm", in.name, "err", err)
	}
	if vg.m.procs.instance(in.name) != in || !alive(in) {
		return // an operation replaced or stopped it meanwhile
	}
	vg.m.log.Warn("den: stopping vm: its disk was on the lost mount", "vm", in.name)
	in.close(true)
	ctx := context.Background()
	vg.m.procs.stopInstance(ctx, in, stopQuit)
	vg.m.procs.recordStopped(ctx, in.name, reason)
}

// DefaultVolumeWait bounds how long starting a VMM waits for the volume
// to be mounted again after its mount died.
const DefaultVolumeWait = time.Minute

// waitDisk makes sure a VM's disk is there before a VMM opens it: when it
// is not, the volume may be down (its mount died and is being remounted),
// so wait for the volume, boundedly, and look again.
func (vg *volumeGuard) waitDisk(ctx context.Context, name string) error {
	p, err := vg.m.vol.Path(storage.VMDisk(name))
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	wait := vg.m.cfg.VolumeWait
	if wait <= 0 {
		wait = DefaultVolumeWait
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		herr := vg.m.vol.Health(ctx)
		if herr == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm %q: the storage volume is not available (waited %s): %w", name, wait, herr)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("vm %q: its disk is missing from the storage volume: %w", name, err)
	}
	return nil
}

// heldOnLostMount lists the files an adopted VMM holds open on a volume
// mount that is not the live one: the mount died, or was detached (umount
// -l), while den was not running, and the volume was mounted anew since.
// Such a VMM's disk is a file on a dead FUSE connection, or on one that
// nothing reads any more: the guest's writes fail (its filesystem goes
// read-only) or are lost. None: nil.
func (vg *volumeGuard) heldOnLostMount(hv vmm.Hypervisor) []string {
	pid := hv.PID()
	if pid <= 0 {
		return nil
	}
	held, err := storage.HeldOnLostMount(pid, vg.m.vol.Root())
	if err != nil {
		vg.m.log.Warn("den: files the vmm holds", "pid", pid, "err", err)
		return nil
	}
	return held
}

// lostWhileDown is the record's reason for a VM stopped at start because
// its VMM held its disk on a lost mount (held): what was lost, and what a
// restore brings back.
func (vg *volumeGuard) lostWhileDown(ctx context.Context, name string, held []string) string {
	s := fmt.Sprintf("storage volume lost while den was not running: the vmm held its disk on a volume mount that died or was unmounted (%s), so the vm was stopped rather than run on a dead disk; its memory and the disk writes the dead mount had not stored are lost, and it boots from its disk when next used",
		strings.Join(held, ", "))
	return s + vg.m.host.lastCheckpoint(ctx, name, func(id, age string) string {
		return fmt.Sprintf("; a restore brings back its last checkpoint, %s, taken %s ago", id, age)
	})
}

// volumeGuard keeps VMs off a lost or full volume: it watches the mount,
// stops the VMMs a loss left on a dead disk, and refuses work the volume
// has no room for (volume.go, space.go).
type volumeGuard struct{ m *Manager }
