package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/sparse"
)

// Store is a content-addressed store of memory extents in a directory on
// the volume: packs/ holds the packs, tmp/ the packs being written, and
// lock is the file whose flock orders writers and the collector.
type Store struct {
	root string
	idx  index

	// damaged are digests a copy of which was read and did not match:
	// a new snapshot writes them again rather than name the copies it
	// would share.
	dmu     sync.Mutex
	damaged map[Digest]bool
	// Hook, when set, is called at the named steps of a write and a
	// collection ("pack-written", "collect-listed", "collect-removed"):
	// the crash tests' way in.
	Hook func(step string)
}

// Open opens (making it when needed) the store rooted at dir.
func Open(dir string) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, "packs"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open memory store: %w", err)
		}
	}
	return &Store{root: dir}, nil
}

func (s *Store) hook(step string) {
	if s.Hook != nil {
		s.Hook(step)
	}
}

// markDamaged records that a copy of d did not match.
func (s *Store) markDamaged(d Digest) {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if s.damaged == nil {
		s.damaged = map[Digest]bool{}
	}
	s.damaged[d] = true
}

func (s *Store) isDamaged(d Digest) bool {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	return s.damaged[d]
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

func (s *Store) packPath(name string) string { return filepath.Join(s.root, "packs", name) }

// validPack says whether name is a pack's name: 32 hex digits.
func validPack(name string) bool {
	if len(name) != 32 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil
}

func newPackName() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// lock takes the store's lock, shared or exclusive, until the returned
// func is called. The lock is a flock on the volume, so it orders every
// host that mounts it.
func (s *Store) lock(ctx context.Context, how int) (func(), error) {
	return s.lockFile(ctx, "lock", how)
}

// lockFile takes the flock of the store's file name.
func (s *Store) lockFile(ctx context.Context, name string, how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.root, name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("memory store lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("memory store lock: %w", err)
		}
		if err := sleepCtx(ctx, lockPoll); err != nil {
			f.Close()
			return nil, fmt.Errorf("memory store lock: %w", err)
		}
	}
}

// Origin is a manifest a new snapshot may share extents with: the
// snapshot the RAM last equalled.
type Origin struct {
	m       *Manifest
	names   map[Digest]bool
	byIndex map[int64]Digest
	// copy, when set, is a local copy of the origin's memory: an extent
	// whose bytes equal the copy's is known by the origin's digest, with
	// no hash (a compare costs a tenth of a BLAKE3 here).
	copy *os.File
}

// NewOrigin indexes m's extents by digest.
func NewOrigin(m *Manifest) *Origin {
	if m == nil {
		return nil
	}
	o := &Origin{m: m, names: make(map[Digest]bool, len(m.Extents)), byIndex: make(map[int64]Digest, len(m.Extents))}
	for _, e := range m.Extents {
		o.names[e.Digest] = true
		o.byIndex[e.Index] = e.Digest
	}
	return o
}

// unchanged says whether the n bytes b at extent idx equal the origin's
// local copy there, and the origin's digest of them.
func (o *Origin) unchanged(idx int64, b, scratch []byte) (Digest, bool) {
	if o == nil || o.copy == nil {
		return Digest{}, false
	}
	d, ok := o.byIndex[idx]
	if !ok {
		return Digest{}, false
	}
	got, err := o.copy.ReadAt(scratch[:len(b)], idx*ExtentSize)
	if got != len(b) || (err != nil && !errors.Is(err, io.EOF)) {
		return Digest{}, false
	}
	return d, bytes.Equal(b, scratch[:len(b)])
}

// Manifest is the origin's manifest.
func (o *Origin) Manifest() *Manifest {
	if o == nil {
		return nil
	}
	return o.m
}

func (o *Origin) has(d Digest) bool { return o != nil && o.names[d] }

// WriteStats says what a write did.
type WriteStats struct {
	Extents int   // extents that hold data
	Reused  int   // of them, found in the origin
	Written int64 // bytes written into the new pack
	Pack    string
}

// Write stores the memory in the file at src (a paused guest's RAM file,
// or a copy of one) and returns its manifest: its data extents are hashed
// and those the origin (nil: none) does not hold are written into one new
// pack, synced and in packs/ when Write returns. The caller must hold the
// shared lock (Writer) from before it chose the origin until the manifest
// is written, and must write the manifest only after Write returns.
func (s *Store) Write(ctx context.Context, src string, origin *Origin, ranges []sparse.Extent) (*Manifest, WriteStats, error) {
	var st WriteStats
	f, err := os.Open(src)
	if err != nil {
		return nil, st, fmt.Errorf("store memory: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, st, fmt.Errorf("store memory: %w", err)
	}
	size := fi.Size()
	if ranges == nil {
		if ranges, _, err = sparse.DataRanges(src); err != nil {
			return nil, st, fmt.Errorf("store memory: %w", err)
		}
	}
	m := &Manifest{Version: version, Algorithm: Algorithm, ExtentSize: ExtentSize, Size: size, Extents: []Extent{}}
	var pw *packWriter
	defer func() { pw.abort() }()
	buf, scratch := make([]byte, ExtentSize), make([]byte, ExtentSize)
	for _, idx := range dataIndexes(ranges, size) {
		if err := ctx.Err(); err != nil {
			return nil, st, fmt.Errorf("store memory: %w", err)
		}
		off := idx * ExtentSize
		n := min(ExtentSize, size-off)
		if _, err := f.ReadAt(buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return nil, st, fmt.Errorf("store memory: read %s at %d: %w", src, off, err)
		}
		if allZero(buf[:n]) {
			continue
		}
		d, same := origin.unchanged(idx, buf[:n], scratch)
		if !same {
			d = Digest(blake3.Sum256(buf[:n]))
		}
		st.Extents++
		m.Extents = append(m.Extents, Extent{Index: idx, Digest: d})
		if origin.has(d) && !s.isDamaged(d) {
			st.Reused++
			continue
		}
		if pw == nil {
			if pw, err = s.newPack(); err != nil {
				return nil, st, fmt.Errorf("store memory: %w", err)
			}
		}
		if pw.has(d) {
			continue // the same bytes twice in this memory
		}
		if err := pw.add(d, buf[:n]); err != nil {
			return nil, st, fmt.Errorf("store memory: %w", err)
		}
		st.Written += n
	}
	if pw != nil && len(pw.entries) > 0 {
		if err := pw.commit(); err != nil {
			return nil, st, fmt.Errorf("store memory: %w", err)
		}
		st.Pack = pw.name
		s.hook("pack-written")
	}
	return m, st, nil
}

// Writer takes the shared lock a snapshot holds while it writes: from
// before it trusts its origin's manifest to after its own is written.
func (s *Store) Writer(ctx context.Context) (unlock func(), err error) {
	return s.lock(ctx, unix.LOCK_SH)
}

// dataIndexes lists the extents that ranges touch, in order.
func dataIndexes(ranges []sparse.Extent, size int64) []int64 {
	var out []int64
	next := int64(0)
	for _, r := range ranges {
		first := max(r.Off/ExtentSize, next)
		last := min((r.Off+r.Len-1)/ExtentSize, (size-1)/ExtentSize)
		for i := first; i <= last; i++ {
			out = append(out, i)
		}
		next = max(next, last+1)
	}
	return out
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// packWriter writes a new pack and its index in tmp/, then renames both
// into packs/.
type packWriter struct {
	s       *Store
	name    string
	f       *os.File
	at      int64
	entries []idxEntry
	in      map[Digest]bool
}

func (s *Store) newPack() (*packWriter, error) {
	name, err := newPackName()
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(s.root, "tmp", name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	return &packWriter{s: s, name: name, f: f, in: map[Digest]bool{}}, nil
}

func (w *packWriter) has(d Digest) bool { return w.in[d] }

func (w *packWriter) add(d Digest, b []byte) error {
	if _, err := w.f.Write(b); err != nil {
		return fmt.Errorf("write pack %s: %w", w.name, err)
	}
	w.entries = append(w.entries, idxEntry{Digest: d, At: w.at, Len: int64(len(b))})
	w.in[d] = true
	w.at += int64(len(b))
	return nil
}

// commit syncs the pack, writes its index, and moves both into packs/:
// the pack first, so that an index never names a pack that is not
// there.
func (w *packWriter) commit() error {
	err := w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	tmp := filepath.Join(w.s.root, "tmp", w.name)
	var idx string
	if err == nil {
		idx, err = w.s.writeIndex(w.name, w.entries)
	}
	if err == nil {
		err = os.Rename(tmp, w.s.packPath(w.name))
	}
	if err == nil {
		err = os.Rename(idx, w.s.idxPath(w.name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		if idx != "" {
			_ = os.Remove(idx)
		}
		_ = os.Remove(w.s.packPath(w.name))
		return fmt.Errorf("write pack %s: %w", w.name, err)
	}
	w.s.learn(w.name, w.entries)
	return nil
}

// abort drops a pack not committed.
func (w *packWriter) abort() {
	if w == nil || w.f == nil {
		return
	}
	w.f.Close()
	_ = os.Remove(filepath.Join(w.s.root, "tmp", w.name))
}

// SaveOptions say what a snapshot's memory may share.
type SaveOptions struct {
	// Origin is the directory of the snapshot the RAM last equalled (""
	// for none: a snapshot whose manifest is gone, or another layout's,
	// shares nothing).
	Origin string
	// OriginCopy is a local copy of the origin's memory ("" for none; one
	// of another size is not used): an extent the RAM holds as the copy
	// does is known by the origin's digest, not hashed again.
	OriginCopy string
	// Ranges are the RAM file's data ranges when the caller knows them
	// (nil: asked of its file system).
	Ranges []sparse.Extent
}

// Save stores the memory in the file at src as the snapshot in directory
// dir (its manifest written there, not synced), sharing what it can with
// the origin. It holds the shared lock throughout, so a collection sees
// either the origin's manifest or this one.
func (s *Store) Save(ctx context.Context, src, dir string, so SaveOptions) (*Manifest, WriteStats, error) {
	unlock, err := s.Writer(ctx)
	if err != nil {
		return nil, WriteStats{}, err
	}
	defer unlock()
	var o *Origin
	if so.Origin != "" {
		if om, err := ReadManifest(so.Origin); err == nil {
			o = NewOrigin(om)
			if c, err := os.Open(so.OriginCopy); err == nil {
				if st, err := c.Stat(); err == nil && st.Size() == om.Size {
					o.copy = c
				}
				defer c.Close()
			}
		}
	}
	m, st, err := s.Write(ctx, src, o, so.Ranges)
	if err != nil {
		return nil, st, err
	}
	if err := WriteManifest(dir, m); err != nil {
		return nil, st, err
	}
	return m, st, nil
}
