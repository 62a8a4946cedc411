package memstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// ErrChanged says that the volume changed under a listing of its
// manifests (a directory renamed or removed while it was walked): the
// listing may have missed a manifest, so a collection stops there.
var ErrChanged = errors.New("the snapshots changed while they were listed")

// FindManifests lists the memory manifests under dirs (missing ones are
// empty): the roots a collection keeps and usage counts. An entry that
// vanishes while it is walked (a slot renamed into place) fails it with
// ErrChanged: a rename can carry a manifest from a directory not yet
// walked into one walked already.
func FindManifests(dirs ...string) ([]string, error) {
	var out []string
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					if p == d {
						return nil
					}
					return fmt.Errorf("%s: %w", p, ErrChanged)
				}
				return err
			}
			if !e.IsDir() && e.Name() == ManifestFile {
				out = append(out, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("find memory manifests: %w", err)
		}
	}
	sort.Strings(out)
	return out, nil
}

// CollectOptions tune Collect.
type CollectOptions struct {
	// DryRun only says what would go.
	DryRun bool
	// Grace keeps unreferenced packs younger than this: a snapshot that
	// wrote one has not written its manifest yet.
	Grace time.Duration
	// Pause is the rest after each removal: the collection's bound on
	// the volume's work.
	Pause time.Duration
}

// DefaultGrace is longer than any snapshot takes from its pack to its
// manifest.
const DefaultGrace = 10 * time.Minute

// Collected says what a collection found and removed.
type Collected struct {
	Manifests int      `json:"manifests"`
	Packs     int      `json:"packs"`     // packs in the store
	Garbage   []string `json:"garbage"`   // unreferenced packs old enough to go
	Bytes     int64    `json:"bytes"`     // their size
	Young     int      `json:"young"`     // unreferenced packs kept for the grace period
	Removed   int      `json:"removed"`   // removed (0 on a dry run)
	Temporary int      `json:"temporary"` // abandoned temporary packs removed
	DryRun    bool     `json:"dry_run"`
}

// Collect removes the packs that no manifest under roots names and that
// are older than the grace period, and temporary packs a crash left. Which
// packs go is decided under the store's exclusive lock (no snapshot is
// between trusting its origin and writing its manifest); they are removed
// after it, paced: a manifest written since names only packs that were
// named then or are younger than the grace period. A manifest that cannot
// be read stops the collection: what it names is unknown.
func (s *Store) Collect(ctx context.Context, roots []string, o CollectOptions) (Collected, error) {
	c := Collected{DryRun: o.DryRun, Garbage: []string{}}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return c, fmt.Errorf("collect memory: %w", err)
	}
	var garbage, tmp []string
	for try := 0; ; try++ {
		c = Collected{DryRun: o.DryRun, Garbage: []string{}}
		garbage, tmp, err = s.choose(roots, o.Grace, &c)
		if !errors.Is(err, ErrChanged) || try == 2 {
			break
		}
	}
	unlock()
	if err != nil {
		return c, fmt.Errorf("collect memory: %w", err)
	}
	s.hook("collect-listed")
	if o.DryRun {
		return c, nil
	}
	remove := func(p string) bool {
		err := os.Remove(p)
		if o.Pause > 0 {
			_ = sleepCtx(ctx, o.Pause)
		}
		return err == nil || errors.Is(err, fs.ErrNotExist)
	}
	for _, name := range garbage {
		if ctx.Err() != nil {
			break
		}
		if remove(s.packPath(name)) {
			c.Removed++
			s.hook("collect-removed")
		}
	}
	for _, p := range tmp {
		if ctx.Err() != nil {
			break
		}
		if remove(p) {
			c.Temporary++
		}
	}
	return c, ctx.Err()
}

// choose lists the manifests and the packs and picks the packs to go.
func (s *Store) choose(roots []string, grace time.Duration, c *Collected) (garbage, tmp []string, err error) {
	paths, err := FindManifests(roots...)
	if err != nil {
		return nil, nil, err
	}
	live := map[string]bool{}
	for _, p := range paths {
		m, err := readManifestFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("%s: %w", p, ErrChanged) // removed, or renamed elsewhere
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		c.Manifests++
		for _, name := range m.Packs {
			live[name] = true
		}
	}
	packs, err := os.ReadDir(filepath.Join(s.root, "packs"))
	if err != nil {
		return nil, nil, err
	}
	old := time.Now().Add(-grace)
	for _, e := range packs {
		if !isPackName(e.Name()) {
			continue
		}
		c.Packs++
		if live[e.Name()] {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // gone meanwhile
		}
		if info.ModTime().After(old) {
			c.Young++
			continue
		}
		garbage = append(garbage, e.Name())
		c.Garbage = append(c.Garbage, e.Name())
		c.Bytes += info.Size()
	}
	tmps, err := os.ReadDir(filepath.Join(s.root, "tmp"))
	if err != nil {
		return nil, nil, err
	}
	for _, e := range tmps {
		if info, err := e.Info(); err == nil && info.ModTime().Before(old) {
			tmp = append(tmp, filepath.Join(s.root, "tmp", e.Name()))
		}
	}
	return garbage, tmp, nil
}

func readManifestFile(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseManifest(data)
}

// Usage is what a group of manifests holds in the store.
type Usage struct {
	// Referenced is the data its manifests name, each stored extent
	// counted once.
	Referenced int64 `json:"referenced_bytes"`
	// Unique is the part no manifest outside the group names: what
	// deleting the group frees.
	Unique int64 `json:"unique_bytes"`
	// Shared is Referenced less Unique.
	Shared int64 `json:"shared_bytes"`
}

// StoreUsage is the store's bytes, and each group's.
type StoreUsage struct {
	// Stored is the size of every pack; Live the part of it some
	// manifest names; Garbage the rest (whole packs no manifest names,
	// and dead extents inside packs still named).
	Stored  int64            `json:"stored_bytes"`
	Live    int64            `json:"live_bytes"`
	Garbage int64            `json:"garbage_bytes"`
	Packs   int              `json:"packs"`
	Groups  map[string]Usage `json:"groups"`
}

// Usage counts, for each group of manifests (by path; a manifest that
// is gone counts as empty), what it references in the store, what only
// it references, and the store's total, live and garbage bytes.
func (s *Store) Usage(ctx context.Context, groups map[string][]string) (StoreUsage, error) {
	u := StoreUsage{Groups: map[string]Usage{}}
	type loc struct {
		pack string
		at   int64
	}
	owners := map[loc]map[string]bool{}
	size := map[loc]int64{}
	for g, paths := range groups {
		for _, p := range paths {
			if err := ctx.Err(); err != nil {
				return u, err
			}
			m, err := readManifestFile(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return u, fmt.Errorf("storage usage: %s: %w", p, err)
			}
			for _, e := range m.Extents {
				l := loc{m.Packs[e.Pack], e.At}
				if owners[l] == nil {
					owners[l] = map[string]bool{}
				}
				owners[l][g] = true
				size[l] = e.Len(m.Size)
			}
		}
		u.Groups[g] = Usage{}
	}
	for l, gs := range owners {
		n := size[l]
		u.Live += n
		for g := range gs {
			gu := u.Groups[g]
			gu.Referenced += n
			if len(gs) == 1 {
				gu.Unique += n
			} else {
				gu.Shared += n
			}
			u.Groups[g] = gu
		}
	}
	packs, err := os.ReadDir(filepath.Join(s.root, "packs"))
	if err != nil {
		return u, fmt.Errorf("storage usage: %w", err)
	}
	for _, e := range packs {
		if info, err := e.Info(); err == nil && isPackName(e.Name()) {
			u.Packs++
			u.Stored += info.Size()
		}
	}
	u.Garbage = max(0, u.Stored-u.Live)
	return u, nil
}
