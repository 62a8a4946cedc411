package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/sparse"
)

// Volume is the storage the rest of den uses, without knowing what is
// behind it. Paths are relative to the volume root (see layout.go); Path
// gives the host path to hand to a VMM.
type Volume interface {
	// Root is the host directory where the volume is mounted.
	Root() string
	// Path is the host path of p (which is validated).
	Path(p Path) (string, error)
	// MkdirAll creates directory p and its parents.
	MkdirAll(ctx context.Context, p Path) error
	// CreateDisk creates a sparse file of size bytes at p (parents made);
	// it fails if p exists.
	CreateDisk(ctx context.Context, p Path, size int64) error
	// Clone makes dst a copy of file or directory src, sharing its data:
	// the cost is metadata only, and later writes to either side do not
	// show in the other. Data written to src before the call is in the
	// clone (src is flushed first). dst must not exist; it appears
	// atomically, whole or not at all.
	Clone(ctx context.Context, src, dst Path) error
	// CloneOver clones file src to file dst, replacing dst atomically if it
	// exists (restore: the checkpoint's disk over the active disk).
	CloneOver(ctx context.Context, src, dst Path) error
	// Rename moves from to to atomically, replacing a file at to.
	Rename(ctx context.Context, from, to Path) error
	// Remove removes p and everything under it; no error if it is absent.
	Remove(ctx context.Context, p Path) error
	// Usage is the size of p (a file or a tree).
	Usage(ctx context.Context, p Path) (Usage, error)
	// DataRanges lists the ranges of file p that hold data, in order;
	// the rest of it reads as zeros. Only for a file nobody is writing:
	// writes still buffered are not in it.
	DataRanges(ctx context.Context, p Path) ([]sparse.Extent, error)
	// ReadPath is the host path of p for den's own reads of snapshots
	// (digests, verification): reads there leave the volume's data as it
	// is (JuiceFS would compact a clone's chunks where they are read);
	// ReadRoot is the directory such paths are under.
	ReadPath(p Path) (string, error)
	ReadRoot() string
	// SliceBytes maps the data slices file p references to how many of
	// their bytes it shows: clones share slices, so those no other file
	// references are what removing p frees. A volume that cannot tell
	// answers nil.
	SliceBytes(ctx context.Context, p Path) (map[uint64]int64, error)
	// Health is nil when the volume answers.
	Health(ctx context.Context) error
	// Subscribe delivers the volume's events until the returned func is
	// called.
	Subscribe() (<-chan Event, func())
	// Close releases the Volume. The file system itself stays available to
	// running VMs (see JuiceFS.Unmount).
	Close() error
}

// Usage is how big a file or a tree is.
type Usage struct {
	// Logical is the apparent size: the sum of file lengths.
	Logical int64
	// Data is the bytes of data the files reference, holes excluded. Data
	// shared between clones counts in each of them.
	Data int64
	// Files is the number of regular files.
	Files int
}

var _ Volume = (*JuiceFS)(nil)

// ErrNotMounted is returned by operations on a volume whose mount is down
// (being remounted after a crash, or unmounted).
var ErrNotMounted = errors.New("volume not mounted")

// Root is the mount point.
func (v *JuiceFS) Root() string { return v.cfg.MountPoint }

// Name is the volume name.
func (v *JuiceFS) Name() string { return v.cfg.Name }

// Path maps p to the host path under the mount point.
func (v *JuiceFS) Path(p Path) (string, error) { return hostPath(v.cfg.MountPoint, p) }

// live maps p and checks that the mount is up, so that nothing is ever
// written into the bare mount point directory while the volume is down.
func (v *JuiceFS) live(p Path) (string, error) {
	hp, err := v.Path(p)
	if err != nil {
		return "", err
	}
	dev := v.dev.Load()
	if dev == 0 {
		return "", ErrNotMounted
	}
	var st unixStat
	if err := stat(v.cfg.MountPoint, &st); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotMounted, err)
	}
	if st.Dev != dev {
		return "", ErrNotMounted
	}
	return hp, nil
}

// MkdirAll creates directory p and its parents.
func (v *JuiceFS) MkdirAll(ctx context.Context, p Path) error {
	hp, err := v.live(p)
	if err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	if err := os.MkdirAll(hp, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

// CreateDisk creates a sparse file of size bytes.
func (v *JuiceFS) CreateDisk(ctx context.Context, p Path, size int64) error {
	hp, err := v.live(p)
	if err != nil {
		return fmt.Errorf("create disk %s: %w", p, err)
	}
	return createSparse(hp, p, size)
}

func createSparse(hp string, p Path, size int64) error {
	if size < 0 {
		return fmt.Errorf("create disk %s: negative size %d", p, size)
	}
	if err := os.MkdirAll(filepath.Dir(hp), 0o755); err != nil {
		return fmt.Errorf("create disk %s: %w", p, err)
	}
	f, err := os.OpenFile(hp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create disk %s: %w", p, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(hp)
		return fmt.Errorf("create disk %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(hp)
		return fmt.Errorf("create disk %s: %w", p, err)
	}
	return f.Close()
}

// Clone clones src to dst as `juicefs clone` does (control.go), through a
// temporary name renamed into place.
func (v *JuiceFS) Clone(ctx context.Context, src, dst Path) error {
	if err := v.clone(ctx, src, dst, false); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}

// CloneOver clones file src over file dst.
func (v *JuiceFS) CloneOver(ctx context.Context, src, dst Path) error {
	if err := v.clone(ctx, src, dst, true); err != nil {
		return fmt.Errorf("clone %s over %s: %w", src, dst, err)
	}
	return nil
}

func (v *JuiceFS) clone(ctx context.Context, src, dst Path, replace bool) error {
	hs, err := v.live(src)
	if err != nil {
		return err
	}
	hd, err := v.live(dst)
	if err != nil {
		return err
	}
	if strings.HasPrefix(string(dst)+"/", string(src)+"/") {
		return errors.New("destination inside source")
	}
	st, err := os.Stat(hs)
	if err != nil {
		return err
	}
	if replace && st.IsDir() {
		return errors.New("source is a directory: CloneOver takes files")
	}
	if _, err := os.Lstat(hd); err == nil && !replace {
		return fmt.Errorf("destination: %w", fs.ErrExist)
	}
	if err := atomicfile.SyncTree(hs); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(hd), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(hd), fmt.Sprintf(".%s%s%d", filepath.Base(hd), cloneTempMark, time.Now().UnixNano()))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	err = ControlClone(ctx, v.cfg.MountPoint, hs, tmp)
	if errors.Is(err, errNoControl) {
		_, err = v.run(ctx, false, "clone", "--preserve", hs, tmp)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if replace {
		err = os.Rename(tmp, hd)
	} else {
		// Fail rather than replace a dst that appeared meanwhile.
		err = renameNoReplace(tmp, hd)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// cloneTempMark marks the temporary name a clone is made under, beside
// its destination, before it is renamed there: .NAME.clone-N.
const cloneTempMark = ".clone-"

// IsCloneTemp says whether name (a base name) is a clone's temporary
// file, which a crash or a kill during the clone leaves behind; it
// holds a reference to its source's data until removed.
func IsCloneTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, cloneTempMark)
}

// Rename moves from to to atomically.
func (v *JuiceFS) Rename(ctx context.Context, from, to Path) error {
	hf, err := v.live(from)
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	ht, err := v.live(to)
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	return renamePaths(hf, ht, from, to)
}

func renamePaths(hf, ht string, from, to Path) error {
	if err := os.MkdirAll(filepath.Dir(ht), 0o755); err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	if err := os.Rename(hf, ht); err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	return nil
}

// Remove removes p and everything under it.
func (v *JuiceFS) Remove(ctx context.Context, p Path) error {
	hp, err := v.live(p)
	if err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	if err := os.RemoveAll(hp); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Health is nil when the mount answers within the probe timeout.
func (v *JuiceFS) Health(ctx context.Context) error {
	if v.dev.Load() == 0 {
		return fmt.Errorf("volume %q: %w", v.cfg.Name, ErrNotMounted)
	}
	if _, err := v.probe.run(ctx, v.cfg.MountPoint, v.opts.timeout); err != nil {
		return fmt.Errorf("volume %q: mount not answering: %w", v.cfg.Name, err)
	}
	return nil
}
