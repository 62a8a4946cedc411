package machine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"

	"github.com/denhq/den/internal/phase"
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

// sparesDir holds the spare disks, one per base disk.
const sparesDir storage.Path = "spares"

// spareFor is the spare clone of the base disk src.
func spareFor(src storage.Path) storage.Path {
	sum := sha256.Sum256([]byte(src))
	return sparesDir.Join("disk-" + hex.EncodeToString(sum[:8]))
}

// takeSpare moves the spare clone of src, when there is one, to dst.
func (m *Manager) takeSpare(ctx context.Context, src, dst storage.Path) bool {
	spare := spareFor(src)
	p, err := m.vol.Path(spare)
	if err != nil {
		return false
	}
	if _, err := os.Stat(p); err != nil {
		return false
	}
	defer phase.Begin(ctx, "take a spare disk")()
	return m.vol.Rename(ctx, spare, dst) == nil
}

// refillSpare makes the spare clone of src in the background, unless
// there is one or one is being made.
func (m *Manager) refillSpare(src storage.Path) {
	spare := spareFor(src)
	m.spareMu.Lock()
	if m.spareBusy[spare] {
		m.spareMu.Unlock()
		return
	}
	if m.spareBusy == nil {
		m.spareBusy = map[storage.Path]bool{}
	}
	m.spareBusy[spare] = true
	m.spareMu.Unlock()
	started := m.goBackground(func() {
		defer m.spareDone(spare)
		ctx, cancel := m.lifetime()
		defer cancel()
		if p, err := m.vol.Path(spare); err != nil {
			return
		} else if _, err := os.Stat(p); err == nil {
			return
		}
		if err := m.vol.Clone(ctx, src, spare); err != nil && !errors.Is(err, fs.ErrExist) {
			m.log.Debug("den: spare disk", "base", string(src), "err", err)
		}
	})
	if !started {
		m.spareDone(spare)
	}
}

func (m *Manager) spareDone(spare storage.Path) {
	m.spareMu.Lock()
	delete(m.spareBusy, spare)
	m.spareMu.Unlock()
}

// dropSpares removes every spare disk.
func (m *Manager) dropSpares(ctx context.Context) {
	if err := m.vol.Remove(ctx, sparesDir); err != nil {
		m.log.Debug("den: remove spare disks", "err", err)
	}
}
