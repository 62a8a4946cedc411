package machine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/denhq/den/storage"
)

// suspendNew is where a new suspend snapshot is written before it
// replaces the VM's suspend slot.
func suspendNew(name string) storage.Path { return storage.VMDir(name).Join("suspend-new") }

// swapSuspend moves a complete suspend-new into the suspend slot. A crash
// between the two renames leaves no slot and a whole suspend-new, which
// sweepSuspend swaps in.
func (ss *snapshots) swapSuspend(ctx context.Context, name string) error {
	if err := ss.retireSuspend(ctx, name); err != nil {
		return err
	}
	return ss.m.vol.Rename(ctx, suspendNew(name), storage.SuspendDir(name))
}

// retiredPrefix begins the names of obsolete suspend slots waiting, in
// their VM's directory, for their removal (suspend-old-N: each its own,
// so that retiring a slot never waits for an older one's removal).
const retiredPrefix = "suspend-old"

// retireSuspend moves name's suspend slot out of the way, for
// removeRetired to remove once the operation is over: the rename is one
// metadata operation, where the removal of a memory file costs 50-150 ms
// of FUSE and page-cache work, and holds the volume's metadata meanwhile
// (a clone or a rename waits for it). With no slot there is nothing to
// do; a slot that cannot be renamed is removed now. A retired slot a
// crash left behind goes after the next start (sweepSuspend).
func (ss *snapshots) retireSuspend(ctx context.Context, name string) error {
	slot, err := ss.m.vol.Path(storage.SuspendDir(name))
	if err != nil {
		return err
	}
	if _, err := os.Lstat(slot); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	old := storage.VMDir(name).Join(fmt.Sprintf("%s-%d", retiredPrefix, time.Now().UnixNano()))
	if err := ss.m.vol.Rename(ctx, storage.SuspendDir(name), old); err != nil {
		return ss.m.vol.Remove(ctx, storage.SuspendDir(name))
	}
	return nil
}

// removeRetired removes name's retired suspend slots in the background,
// at a low priority: one removal per VM at a time (a call while one runs
// makes it look again when done), and at most two VMs' at once.
func (ss *snapshots) removeRetired(name string) {
	ss.retireMu.Lock()
	if ss.retiring == nil {
		ss.retiring = map[string]bool{}
	}
	if _, running := ss.retiring[name]; running {
		ss.retiring[name] = true // again, once the running removal is over
		ss.retireMu.Unlock()
		return
	}
	ss.retiring[name] = false
	ss.retireMu.Unlock()
	started := ss.m.goBackground(func() {
		ctx, cancel := ss.m.lifetime()
		defer cancel()
		for {
			select {
			case ss.removals <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() == nil {
				// Niced only once its turn has come: a start's removals
				// wait without an OS thread each.
				lowPriority()
				ss.removeRetiredNow(ctx, name)
				<-ss.removals
			}
			ss.retireMu.Lock()
			again := ss.retiring[name] && ctx.Err() == nil
			if !again {
				delete(ss.retiring, name)
			} else {
				ss.retiring[name] = false
			}
			ss.retireMu.Unlock()
			if !again {
				return
			}
		}
	})
	if !started {
		ss.retireMu.Lock()
		delete(ss.retiring, name)
		ss.retireMu.Unlock()
	}
}

// removeRetiredNow removes name's retired suspend slots.
func (ss *snapshots) removeRetiredNow(ctx context.Context, name string) {
	dir, err := ss.m.vol.Path(storage.VMDir(name))
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), retiredPrefix) {
			continue
		}
		if err := ss.m.vol.Remove(ctx, storage.VMDir(name).Join(e.Name())); err != nil {
			ss.m.log.Debug("den: remove a retired suspend slot", "vm", name, "err", err)
		}
		ss.m.gc.poke()
	}
}
