package machine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// Spare disks. A create clones its base's disk as the VM's disk: a juicefs
// process (some 80 ms here, more under load), and the VMM cannot start
// before it is over, since it opens the disk. That clone does not depend
// on the VM, so one is made ahead: after a create, den clones the same
// base disk once more, in the background, to spares/KEY on the volume,
// and the next create from that base renames it into place (a few ms).
// A base's disk never changes once made, so a spare is as good as a fresh
// clone; spares go when a daemon starts (one may be half made) and when a
// damaged base is dropped.
//
// A checkpoint's disk never changes either: a restore to a checkpoint
// leaves a spare of its disk, spares/VM@ID-SEAL, which the next restore
// to it (an agent trying again from the same point) renames over the VM's
// disk rather than cloning it while the VM waits. The seal in its name
// ties it to that checkpoint's content: a spare that outlived its
// checkpoint can never pass for another checkpoint's. A spare shares all
// its data with its checkpoint: it costs metadata and the clone's time in
// the background. It goes with its checkpoint (after its clone, if one
// is being made) and with its VM.

// spares are the spare disks on the volume, and the clones of them being
// made.
type spares struct {
	vol storage.Volume
	log *slog.Logger
	// background runs f in the background while den runs (its ctx ends
	// when den closes); false when den is closing and it did not.
	background func(f func(ctx context.Context)) bool

	mu   sync.Mutex
	busy map[storage.Path]chan struct{} // spares being made, closed when done
}

// sparesDir holds the spare disks, one per base disk.
const sparesDir storage.Path = "spares"

// spareFor is the spare clone of the base disk src.
func spareFor(src storage.Path) storage.Path {
	sum := sha256.Sum256([]byte(src))
	return sparesDir.Join("disk-" + hex.EncodeToString(sum[:8]))
}

// checkpointSpare is the spare clone of checkpoint cp's disk (vm names
// have no '@').
func checkpointSpare(cp registry.Checkpoint) storage.Path {
	return sparesDir.Join(cp.VM + "@" + checkpointKey(cp.ID, cp.Seal))
}

// take moves spare, when it is there, to dst (replacing dst). A
// spare still being made is waited for: it is over sooner than a clone
// started now would be.
func (s *spares) take(ctx context.Context, spare, dst storage.Path) bool {
	s.mu.Lock()
	making := s.busy[spare]
	s.mu.Unlock()
	if making != nil {
		end := phase.Begin(ctx, "wait for the spare disk")
		select {
		case <-making:
		case <-ctx.Done():
		}
		end()
	}
	p, err := s.vol.Path(spare)
	if err != nil {
		return false
	}
	if _, err := os.Stat(p); err != nil {
		return false
	}
	defer phase.Begin(ctx, "take a spare disk")()
	return s.vol.Rename(ctx, spare, dst) == nil
}

// put moves src, a clone of spare's source no VM ran on, to spare
// unless a spare is there or being made; false leaves src where it is.
func (s *spares) put(ctx context.Context, src, spare storage.Path) bool {
	s.mu.Lock()
	making := s.busy[spare] != nil
	s.mu.Unlock()
	p, err := s.vol.Path(spare)
	if err != nil || making {
		return false
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	return s.vol.Rename(ctx, src, spare) == nil
}

// refill makes spare, a clone of src, in the background, unless it
// is there or being made.
func (s *spares) refill(src, spare storage.Path) {
	s.mu.Lock()
	if s.busy[spare] != nil {
		s.mu.Unlock()
		return
	}
	if s.busy == nil {
		s.busy = map[storage.Path]chan struct{}{}
	}
	s.busy[spare] = make(chan struct{})
	s.mu.Unlock()
	started := s.background(func(ctx context.Context) {
		defer s.made(spare)
		if p, err := s.vol.Path(spare); err != nil {
			return
		} else if _, err := os.Stat(p); err == nil {
			return
		}
		if err := s.vol.Clone(ctx, src, spare); err != nil && !errors.Is(err, fs.ErrExist) {
			s.log.Debug("den: spare disk", "base", string(src), "err", err)
		}
	})
	if !started {
		s.made(spare)
	}
}

// made says the clone of spare is over.
func (s *spares) made(spare storage.Path) {
	s.mu.Lock()
	close(s.busy[spare])
	delete(s.busy, spare)
	s.mu.Unlock()
}

// dropAll removes every spare disk.
func (s *spares) dropAll(ctx context.Context) {
	if err := s.vol.Remove(ctx, sparesDir); err != nil {
		s.log.Debug("den: remove spare disks", "err", err)
	}
}

// dropVM removes the spare disks of vm's checkpoints.
func (s *spares) dropVM(ctx context.Context, vm string) {
	dir, err := s.vol.Path(sparesDir)
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), vm+"@") {
			_ = s.vol.Remove(ctx, sparesDir.Join(e.Name()))
		}
	}
}

// refillCheckpoint makes the spare of checkpoint cp.
func (s *spares) refillCheckpoint(cp registry.Checkpoint) {
	s.refill(storage.CheckpointFile(cp.VM, cp.ID, checkpoint.DiskFile), checkpointSpare(cp))
}

// dropCheckpoint removes the spares of vm's checkpoint id, whatever
// their seal, once the clones being made of them are over (bounded by
// ctx): a clone that ended after the removal would leave one behind.
func (s *spares) dropCheckpoint(ctx context.Context, vm, id string) {
	prefix := string(sparesDir.Join(vm + "@" + id + "-"))
	s.mu.Lock()
	var making []chan struct{}
	for spare, done := range s.busy {
		if strings.HasPrefix(string(spare), prefix) {
			making = append(making, done)
		}
	}
	s.mu.Unlock()
	for _, done := range making {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	dir, err := s.vol.Path(sparesDir)
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), vm+"@"+id+"-") {
			_ = s.vol.Remove(ctx, sparesDir.Join(e.Name()))
		}
	}
}
