// Package poll waits for a condition, bounded in time: the one wait that
// den's tests and benchmarks use instead of sleeping long enough.
package poll

import "time"

// Until checks cond until it holds (true) or within has passed (false).
// It checks at once, then every 2 ms doubling to 100 ms: a fast condition
// costs little, and a slow one does not spin.
func Until(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	interval := 2 * time.Millisecond
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(interval, left))
		interval = min(2*interval, 100*time.Millisecond)
	}
	return true
}
