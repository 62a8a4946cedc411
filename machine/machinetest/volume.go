//go:build linux

package machinetest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/storage"
)

// Volume is a storage.Volume that is a plain directory: clones are
// copies (sparse), renames are renames. Emit sends it events as the
// JuiceFS supervisor would.
type Volume struct {
	root string
	mu   sync.Mutex
	subs map[chan storage.Event]struct{}
	// fail, when set (SetFail), is returned by every mutating call and by
	// Health: a dead or unmounted backend.
	fail error
	// UsageDelay makes Usage as slow as a metadata walk on JuiceFS.
	UsageDelay time.Duration
	health     atomic.Int64 // Health calls
	usage      atomic.Int64 // Usage calls
	// held, when set (HoldUsage), holds Usage back until it is closed.
	held chan struct{}
}

var _ storage.Volume = (*Volume)(nil)

// NewVolume returns a volume rooted at dir (created).
func NewVolume(dir string) (*Volume, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Volume{root: dir, subs: map[chan storage.Event]struct{}{}}, nil
}

// Root is the directory.
func (v *Volume) Root() string { return v.root }

// ReadPath is Path: a plain directory has no reads that change it.
func (v *Volume) ReadPath(p storage.Path) (string, error) { return v.Path(p) }

// SliceBytes is nil: a plain directory shares no data between files.
func (v *Volume) SliceBytes(context.Context, storage.Path) (map[uint64]int64, error) { return nil, nil }

// ReadRoot is Root.
func (v *Volume) ReadRoot() string { return v.root }

// Path maps p into the directory.
func (v *Volume) Path(p storage.Path) (string, error) {
	if err := p.Validate(); err != nil {
		return "", err
	}
	return filepath.Join(v.root, filepath.FromSlash(string(p))), nil
}

func (v *Volume) live(p storage.Path) (string, error) {
	if err := v.failure(); err != nil {
		return "", err
	}
	return v.Path(p)
}

// SetFail makes the volume fail (nil: work again).
func (v *Volume) SetFail(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.fail = err
}

func (v *Volume) failure() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.fail
}

// MkdirAll makes a directory.
func (v *Volume) MkdirAll(ctx context.Context, p storage.Path) error {
	h, err := v.live(p)
	if err != nil {
		return err
	}
	return os.MkdirAll(h, 0o700)
}

// CreateDisk makes a sparse file.
func (v *Volume) CreateDisk(ctx context.Context, p storage.Path, size int64) error {
	h, err := v.live(p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(h), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(h, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(size)
}

// Clone copies src (file or tree) to dst, which appears whole or not at all.
func (v *Volume) Clone(ctx context.Context, src, dst storage.Path) error {
	s, err := v.live(src)
	if err != nil {
		return err
	}
	d, err := v.live(dst)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(d); err == nil {
		return fmt.Errorf("clone %s: %s exists", src, dst)
	}
	tmp := d + ".clone-tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(filepath.Dir(d), 0o700); err != nil {
		return err
	}
	if err := copyTree(s, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("clone %s: %w", src, err)
	}
	return os.Rename(tmp, d)
}

func copyTree(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return sparse.Copy(src, dst)
	}
	return filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(out, 0o700)
		}
		return sparse.Copy(p, out)
	})
}

// CloneOver copies file src over dst atomically.
func (v *Volume) CloneOver(ctx context.Context, src, dst storage.Path) error {
	s, err := v.live(src)
	if err != nil {
		return err
	}
	d, err := v.live(dst)
	if err != nil {
		return err
	}
	tmp := d + ".clone-tmp"
	_ = os.RemoveAll(tmp)
	if err := sparse.Copy(s, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, d)
}

// Rename renames.
func (v *Volume) Rename(ctx context.Context, from, to storage.Path) error {
	f, err := v.live(from)
	if err != nil {
		return err
	}
	t, err := v.live(to)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(t), 0o700); err != nil {
		return err
	}
	return os.Rename(f, t)
}

// Remove removes a tree.
func (v *Volume) Remove(ctx context.Context, p storage.Path) error {
	h, err := v.live(p)
	if err != nil {
		return err
	}
	return os.RemoveAll(h)
}

// DataRanges is what the directory's filesystem tells of file p's data
// (SEEK_DATA); one whole range where it cannot tell.
func (v *Volume) DataRanges(ctx context.Context, p storage.Path) ([]sparse.Extent, error) {
	h, err := v.Path(p)
	if err != nil {
		return nil, err
	}
	ext, _, err := sparse.DataRanges(h)
	return ext, err
}

// Usage sums a tree's sizes.
func (v *Volume) Usage(ctx context.Context, p storage.Path) (storage.Usage, error) {
	h, err := v.Path(p)
	if err != nil {
		return storage.Usage{}, err
	}
	v.usage.Add(1)
	if v.UsageDelay > 0 {
		time.Sleep(v.UsageDelay)
	}
	v.mu.Lock()
	held := v.held
	v.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return storage.Usage{}, ctx.Err()
		}
	}
	var u storage.Usage
	err = filepath.WalkDir(h, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				return err
			}
			u.Logical += info.Size()
			u.Data += info.Size()
			u.Files++
		}
		return nil
	})
	return u, err
}

// Health fails while SetFail's error is set.
func (v *Volume) Health(ctx context.Context) error {
	v.health.Add(1)
	return v.failure()
}

// HealthCalls counts the Health calls so far.
func (v *Volume) HealthCalls() int64 { return v.health.Load() }

// HoldUsage holds every Usage back until the returned func is called:
// a metadata walk that takes its time.
func (v *Volume) HoldUsage() (release func()) {
	ch := make(chan struct{})
	v.mu.Lock()
	v.held = ch
	v.mu.Unlock()
	return sync.OnceFunc(func() {
		v.mu.Lock()
		if v.held == ch {
			v.held = nil
		}
		v.mu.Unlock()
		close(ch)
	})
}

// UsageCalls counts the disks measured (Usage calls).
func (v *Volume) UsageCalls() int64 { return v.usage.Load() }

// Subscribe delivers Emit's events.
func (v *Volume) Subscribe() (<-chan storage.Event, func()) {
	ch := make(chan storage.Event, 32)
	v.mu.Lock()
	v.subs[ch] = struct{}{}
	v.mu.Unlock()
	return ch, func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if _, ok := v.subs[ch]; ok {
			delete(v.subs, ch)
			close(ch)
		}
	}
}

// Emit sends an event to the subscribers, stamped now.
func (v *Volume) Emit(e storage.Event) {
	e.Time = time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	for ch := range v.subs {
		select {
		case ch <- e:
		default:
		}
	}
}

// Close ends the subscriptions.
func (v *Volume) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	for ch := range v.subs {
		close(ch)
		delete(v.subs, ch)
	}
	return nil
}

// ErrDead is a Fail value: the backend is gone.
var ErrDead = errors.New("volume backend dead")
