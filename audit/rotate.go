package audit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// rotate shifts audit.log.N-1 to audit.log.N (dropping the oldest
// beyond Keep), audit.log to audit.log.1, and opens a new audit.log.
// l.mu is held. On failure l.f stays a usable file: the current one, or
// the one just renamed, until the next rotation.
func (l *Log) rotate() error {
	// No sync: a rename keeps the file's data, and a Write waiting on
	// the lock should not wait for a disk flush.
	if l.opts.Keep == 0 {
		// Nothing kept: start the file anew.
		if err := l.f.Truncate(0); err != nil {
			return fmt.Errorf("rotate audit log: %w", err)
		}
		l.size = 0
		return nil
	}
	if err := os.Remove(l.path(l.opts.Keep)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	for n := l.opts.Keep - 1; n >= 1; n-- {
		if err := os.Rename(l.path(n), l.path(n+1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotate audit log: %w", err)
		}
	}
	if err := os.Rename(l.path(0), l.path(1)); err != nil {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	old := l.f
	if err := l.open(); err != nil {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	old.Close()
	return nil
}
