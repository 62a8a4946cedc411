package machine

import (
	"time"

	"github.com/denhq/den/storage"
)

// SetFreezeWindow makes the guest's freeze for a disk-only checkpoint
// last d, for a test; the returned func puts it back.
func SetFreezeWindow(d time.Duration) (restore func()) {
	old := freezeWindow
	freezeWindow = d
	return func() { freezeWindow = old }
}

// SetSealDelay holds every seal back d before it starts, for a test;
// the returned func puts it back.
func SetSealDelay(d time.Duration) (restore func()) {
	old := sealDelay
	sealDelay = d
	return func() { sealDelay = old }
}

// Sealing says whether dir's digests are queued or being written: their
// files may be whole a moment before the seal is over.
func (m *Manager) Sealing(dir storage.Path) bool { return m.seal.busy(dir) }
