package memstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/zeebo/blake3"
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
	// Grace keeps packs younger than this as they are: a snapshot that
	// wrote one may not have written its manifest yet.
	Grace time.Duration
	// Pause is the rest after each pack removed or rewritten: the
	// collection's bound on the volume's work.
	Pause time.Duration
}

// DefaultGrace is longer than any snapshot takes from its pack to its
// manifest.
const DefaultGrace = 10 * time.Minute

// RepackBelow: a pack whose live extents are less than this share of it
// (and at least repackMin bytes are dead) has them moved into a new pack,
// and goes.
const (
	RepackBelow = 0.5
	repackMin   = 1 << 20
	// repackMax bounds one new pack of moved extents.
	repackMax = 256 << 20
)

// Collected says what a collection found and did.
type Collected struct {
	Manifests int `json:"manifests"`
	Packs     int `json:"packs"` // packs in the store
	// Garbage are the packs that go: none of their extents is named
	// (or each is named and held by another pack too); Bytes their size.
	Garbage []string `json:"garbage"`
	Bytes   int64    `json:"bytes"`
	// Repacked are the packs mostly dead whose live extents (Moved
	// bytes) go to a new pack, Freed the dead bytes that go with them.
	Repacked  []string `json:"repacked"`
	Moved     int64    `json:"moved_bytes"`
	Freed     int64    `json:"freed_bytes"`
	Young     int      `json:"young"`     // packs kept for the grace period
	Removed   int      `json:"removed"`   // packs removed (0 on a dry run)
	Temporary int      `json:"temporary"` // abandoned temporary files removed
	DryRun    bool     `json:"dry_run"`
}

// packState is what a collection knows of one pack.
type packState struct {
	name    string
	size    int64
	mtime   time.Time
	young   bool
	entries []idxEntry
	live    []idxEntry // the named extents this pack is the holder of
}

// Collect removes the packs that hold nothing a manifest under roots
// names, moves the live extents of packs mostly dead into a new pack and
// removes those, and removes temporary files a crash left; packs younger
// than the grace period stay as they are. What is done is decided under
// the store's exclusive lock (no snapshot is between trusting its origin
// and writing its manifest), and done after it, paced: a manifest
// written since names only extents that were named then, or that are in
// packs younger than the grace period. A manifest that cannot be read
// stops the collection: what it names is unknown.
func (s *Store) Collect(ctx context.Context, roots []string, o CollectOptions) (Collected, error) {
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	// One collection at a time on the volume, from decision to the last
	// removal: two hosts' collections, each deciding which copy of an
	// extent to keep, could otherwise remove both.
	unlockC, err := s.lockFile(ctx, "collect.lock", unix.LOCK_EX)
	if err != nil {
		return Collected{}, fmt.Errorf("collect memory: %w", err)
	}
	defer unlockC()
	cc := s.newCollectCache()
	cc.warm(roots)
	unlock, err := s.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return Collected{}, fmt.Errorf("collect memory: %w", err)
	}
	var c Collected
	var plan collectPlan
	for try := 0; ; try++ {
		c = Collected{DryRun: o.DryRun, Garbage: []string{}, Repacked: []string{}}
		plan, err = s.choose(cc, roots, o.Grace, &c)
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
	rest := func() { _ = sleepCtx(ctx, o.Pause) }
	for _, group := range plan.repack {
		if ctx.Err() != nil {
			break
		}
		done, err := s.repack(ctx, group)
		if err != nil {
			return c, fmt.Errorf("collect memory: %w", err)
		}
		plan.garbage = append(plan.garbage, done...)
		rest()
	}
	for _, name := range plan.garbage {
		if ctx.Err() != nil {
			break
		}
		// The index first: a reader that finds the pack gone reads the
		// indexes again and must not find it there.
		err := os.Remove(s.idxPath(name))
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			err = os.Remove(s.packPath(name))
		}
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			s.forget(name)
			c.Removed++
			s.hook("collect-removed")
		}
		rest()
	}
	for _, p := range plan.tmp {
		if ctx.Err() != nil {
			break
		}
		if err := os.Remove(p); err == nil {
			c.Temporary++
		}
	}
	return c, ctx.Err()
}

// holder is the pack, of those that hold a copy of d (newest first),
// that keeps it: the first whose copy matches d, else the first.
func (s *Store) holder(packs []*packState, d Digest) *packState {
	for _, p := range packs {
		for _, e := range p.entries {
			if e.Digest == d && s.whole(p.name, e) {
				return p
			}
		}
	}
	return packs[0]
}

// whole says whether the copy e names in pack name matches its digest.
func (s *Store) whole(name string, e idxEntry) bool {
	f, err := os.Open(s.packPath(name))
	if err != nil {
		return false
	}
	defer f.Close()
	ok, err := entryWhole(f, e, make([]byte, e.Len))
	return err == nil && ok
}

// entryWhole reads the copy e names from its pack f into buf, and says
// whether it matches its digest (false: buf is too small for it).
func entryWhole(f *os.File, e idxEntry, buf []byte) (bool, error) {
	if e.Len > int64(len(buf)) {
		return false, nil
	}
	if _, err := f.ReadAt(buf[:e.Len], e.At); err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return Digest(blake3.Sum256(buf[:e.Len])) == e.Digest, nil
}

// collectPlan is what a collection does.
type collectPlan struct {
	garbage []string       // packs to remove
	repack  [][]*packState // groups of packs whose live extents go into one new pack each
	tmp     []string       // temporary files to remove
}

// liveDigests reads every manifest under roots and returns the digests
// they name.
func (cc *collectCache) liveDigests(roots []string, c *Collected) (map[Digest]bool, error) {
	paths, err := FindManifests(roots...)
	if err != nil {
		return nil, err
	}
	live := map[Digest]bool{}
	for _, p := range paths {
		ds, err := cc.manifest(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", p, ErrChanged) // removed, or renamed elsewhere
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		c.Manifests++
		for _, d := range ds {
			live[d] = true
		}
	}
	return live, nil
}

// collectCache keeps what a collection read before it took the store's
// lock: the manifests (by path, while the file is the same: inode, size
// and time) and the packs' indexes (a pack never changes). Under the
// lock, which holds every snapshot's write, it reads only what changed.
type collectCache struct {
	s         *Store
	manifests map[string]cachedManifest
	indexes   map[string]*packIndex
}

type cachedManifest struct {
	ino, size uint64
	mtime     int64
	digests   []Digest
}

func (s *Store) newCollectCache() *collectCache {
	return &collectCache{s: s, manifests: map[string]cachedManifest{}, indexes: map[string]*packIndex{}}
}

// manifest is the digests the manifest at path names.
func (cc *collectCache) manifest(path string) ([]Digest, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fs.ErrNotExist
		}
		return nil, err
	}
	if m, ok := cc.manifests[path]; ok && m.ino == st.Ino && m.size == uint64(st.Size) && m.mtime == st.Mtim.Nano() {
		return m.digests, nil
	}
	m, err := readManifestFile(path)
	if err != nil {
		return nil, err
	}
	ds := make([]Digest, len(m.Extents))
	for i, e := range m.Extents {
		ds[i] = e.Digest
	}
	cc.manifests[path] = cachedManifest{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano(), digests: ds}
	return ds, nil
}

// index is pack name's index.
func (cc *collectCache) index(name string) (*packIndex, error) {
	if pi, ok := cc.indexes[name]; ok {
		return pi, nil
	}
	pi, err := cc.s.readPackIndex(name)
	if err == nil {
		cc.indexes[name] = pi
	}
	return pi, err
}

// warm reads, without the lock, what the collection will read under it.
func (cc *collectCache) warm(roots []string) {
	if paths, err := FindManifests(roots...); err == nil {
		for _, p := range paths {
			_, _ = cc.manifest(p)
		}
	}
	if packs, _, err := cc.s.listPacks(); err == nil {
		for _, name := range packs {
			_, _ = cc.index(name)
		}
	}
}

// choose lists the manifests and the packs and plans the collection.
func (s *Store) choose(cc *collectCache, roots []string, grace time.Duration, c *Collected) (collectPlan, error) {
	var plan collectPlan
	if err := s.sameDevice(roots); err != nil {
		return plan, err
	}
	live, err := cc.liveDigests(roots, c)
	if err != nil {
		return plan, err
	}
	// A root that was not the volume's while it was walked (its mount
	// went, and came back) read as empty: every pack would be garbage.
	if err := s.sameDevice(roots); err != nil {
		return plan, err
	}
	indexed, bare, err := s.listPacks()
	if err != nil {
		return plan, err
	}
	old := time.Now().Add(-grace)
	var packs []*packState
	for _, name := range indexed {
		st, err := os.Stat(s.packPath(name))
		if err != nil {
			continue
		}
		pi, err := cc.index(name)
		if err != nil {
			return plan, err
		}
		packs = append(packs, &packState{name: name, size: st.Size(), mtime: st.ModTime(), young: st.ModTime().After(old), entries: pi.Extents})
	}
	c.Packs = len(packs) + len(bare)
	// Each named extent is held by one pack, the newest that has it: a
	// young one if any (it may be the one a new manifest counts on), and
	// a copy written again after another was found damaged. Of an extent
	// with several copies, the newest whole one: pack times tie within a
	// tick of the clock, and a damaged copy must never be the one kept.
	sort.SliceStable(packs, func(i, j int) bool { return packs[i].mtime.After(packs[j].mtime) })
	copies := map[Digest][]*packState{}
	for _, p := range packs {
		for _, e := range p.entries {
			if live[e.Digest] {
				copies[e.Digest] = append(copies[e.Digest], p)
			}
		}
	}
	held := map[Digest]bool{}
	for _, p := range packs {
		for _, e := range p.entries {
			if !live[e.Digest] || held[e.Digest] {
				continue
			}
			if cs := copies[e.Digest]; len(cs) > 1 {
				copies[e.Digest] = []*packState{s.holder(cs, e.Digest)}
			}
			if copies[e.Digest][0] == p {
				held[e.Digest] = true
				p.live = append(p.live, e)
			}
		}
	}
	var group []*packState
	var groupBytes int64
	for _, p := range packs {
		var liveBytes int64
		for _, e := range p.live {
			liveBytes += e.Len
		}
		switch {
		case p.young:
			c.Young++
		case len(p.live) == 0:
			plan.garbage = append(plan.garbage, p.name)
			c.Garbage = append(c.Garbage, p.name)
			c.Bytes += p.size
		case float64(liveBytes) < RepackBelow*float64(p.size) && p.size-liveBytes >= repackMin:
			if groupBytes+liveBytes > repackMax && len(group) > 0 {
				plan.repack = append(plan.repack, group)
				group, groupBytes = nil, 0
			}
			group = append(group, p)
			groupBytes += liveBytes
			c.Repacked = append(c.Repacked, p.name)
			c.Moved += liveBytes
			c.Freed += p.size - liveBytes
		}
	}
	if len(group) > 0 {
		plan.repack = append(plan.repack, group)
	}
	for _, name := range bare { // a crash between a pack and its index
		if st, err := os.Stat(s.packPath(name)); err == nil && st.ModTime().Before(old) {
			plan.garbage = append(plan.garbage, name)
			c.Garbage = append(c.Garbage, name)
			c.Bytes += st.Size()
		}
	}
	tmps, err := os.ReadDir(filepath.Join(s.root, "tmp"))
	if err != nil {
		return plan, err
	}
	for _, e := range tmps {
		if info, err := e.Info(); err == nil && info.ModTime().Before(old) {
			plan.tmp = append(plan.tmp, filepath.Join(s.root, "tmp", e.Name()))
		}
	}
	return plan, nil
}

// repack copies the live extents of a group of packs into one new pack,
// each checked against its digest, and returns the packs whose extents
// all moved (to be removed). A pack with a damaged extent is left as it
// is: its damage stays where verify finds it.
func (s *Store) repack(ctx context.Context, group []*packState) ([]string, error) {
	pw, err := s.newPack()
	if err != nil {
		return nil, err
	}
	defer pw.abort()
	var done []string
	buf := make([]byte, ExtentSize)
	for _, p := range group {
		ok, err := s.movePack(ctx, pw, p, buf)
		if err != nil {
			return nil, err
		}
		if ok {
			done = append(done, p.name)
		}
	}
	if len(pw.entries) > 0 {
		if err := pw.commit(); err != nil {
			return nil, err
		}
	}
	return done, nil
}

// movePack adds p's live extents to pw; false: one is damaged.
func (s *Store) movePack(ctx context.Context, pw *packWriter, p *packState, buf []byte) (bool, error) {
	f, err := os.Open(s.packPath(p.name))
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, e := range p.live {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if ok, err := entryWhole(f, e, buf); !ok || err != nil {
			return false, err
		}
		if !pw.has(e.Digest) {
			if err := pw.add(e.Digest, buf[:e.Len]); err != nil {
				return false, err
			}
		}
	}
	return true, nil
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
	// Referenced is the data its manifests name, each extent counted
	// once.
	Referenced int64 `json:"referenced_bytes"`
	// Unique is the part no manifest outside the group names: what
	// deleting the group frees.
	Unique int64 `json:"unique_bytes"`
	// Shared is Referenced less Unique.
	Shared int64 `json:"shared_bytes"`
}

// StoreUsage is the store's bytes, and each group's.
type StoreUsage struct {
	// Stored is the size of every pack; Live the extents some manifest
	// names, each counted once; Garbage the rest (packs no manifest
	// names, dead extents in packs still named, extents held twice).
	Stored  int64            `json:"stored_bytes"`
	Live    int64            `json:"live_bytes"`
	Garbage int64            `json:"garbage_bytes"`
	Packs   int              `json:"packs"`
	Groups  map[string]Usage `json:"groups"`
}

// Usage counts, for each group of manifests (by path; a manifest that
// is gone counts as empty), what it names in the store, what only it
// names, and the store's total, live and garbage bytes.
func (s *Store) Usage(ctx context.Context, groups map[string][]string) (StoreUsage, error) {
	u := StoreUsage{Groups: map[string]Usage{}}
	owners := map[Digest]map[string]bool{}
	size := map[Digest]int64{}
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
				if owners[e.Digest] == nil {
					owners[e.Digest] = map[string]bool{}
				}
				owners[e.Digest][g] = true
				size[e.Digest] = e.Len(m.Size)
			}
		}
		u.Groups[g] = Usage{}
	}
	for d, gs := range owners {
		n := size[d]
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
	indexed, bare, err := s.listPacks()
	if err != nil {
		return u, fmt.Errorf("storage usage: %w", err)
	}
	for _, name := range append(indexed, bare...) {
		if st, err := os.Stat(s.packPath(name)); err == nil {
			u.Packs++
			u.Stored += st.Size()
		}
	}
	u.Garbage = max(0, u.Stored-u.Live)
	return u, nil
}

// sameDevice checks that each root (or, for one not made yet, its
// parent) is on the store's file system: a volume whose mount went leaves
// its empty mount point, whose listing names nothing.
func (s *Store) sameDevice(roots []string) error {
	var st unix.Stat_t
	if err := unix.Stat(s.root, &st); err != nil {
		return err
	}
	for _, r := range roots {
		var rs unix.Stat_t
		err := unix.Stat(r, &rs)
		if errors.Is(err, unix.ENOENT) {
			err = unix.Stat(filepath.Dir(r), &rs)
		}
		if err != nil {
			return fmt.Errorf("snapshots at %s: %w", r, err)
		}
		if rs.Dev != st.Dev {
			return fmt.Errorf("snapshots at %s are not on the memory store's volume: its mount went", r)
		}
	}
	return nil
}

// FindAllManifests is FindManifests, again while the snapshots change
// under it (at most three times).
func FindAllManifests(dirs ...string) ([]string, error) {
	for try := 0; ; try++ {
		paths, err := FindManifests(dirs...)
		if !errors.Is(err, ErrChanged) || try == 2 {
			return paths, err
		}
	}
}
