package machine

import "time"

// SetFreezeWindow makes the guest's freeze for a disk-only checkpoint
// last d, for a test; the returned func puts it back.
func SetFreezeWindow(d time.Duration) (restore func()) {
	old := freezeWindow
	freezeWindow = d
	return func() { freezeWindow = old }
}
