package memstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"

	"github.com/denhq/den/internal/sparse"
)

// ErrDamaged is wrapped by every error that reports an extent not
// matching its digest, or missing.
var ErrDamaged = errors.New("damaged")

// Damage names an extent of a manifest that is missing or does not match
// its digest.
type Damage struct {
	Digest Digest
	Off    int64  // in the memory
	Pack   string // where it was read, if found
	At     int64
	Detail string
}

func (d Damage) Error() string {
	if d.Pack == "" {
		return fmt.Sprintf("memory at %d MiB (extent %s): %s", d.Off>>20, d.Digest.String()[:16], d.Detail)
	}
	return fmt.Sprintf("memory at %d MiB (extent %s, pack %s at %d): %s", d.Off>>20, d.Digest.String()[:16], d.Pack, d.At, d.Detail)
}

func (d Damage) Unwrap() error { return ErrDamaged }

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

const lockPoll = 20 * time.Millisecond

// placed is an extent of a manifest and where it is.
type placed struct {
	Extent
	loc
}

// readRun is a run of extents that lie back to back in one pack: read
// with one call.
type readRun struct {
	pack string
	at   int64
	ext  []placed
}

const maxRun = 4 << 20

// runs groups extents by pack, in the pack's order, into runs of
// back-to-back extents of at most maxRun bytes.
func runs(ext []placed) []readRun {
	sort.Slice(ext, func(i, j int) bool {
		if ext[i].pack != ext[j].pack {
			return ext[i].pack < ext[j].pack
		}
		return ext[i].at < ext[j].at
	})
	var out []readRun
	for _, e := range ext {
		if k := len(out); k > 0 {
			r := &out[k-1]
			last := r.ext[len(r.ext)-1]
			if last.pack == e.pack && last.at+last.n == e.at && e.at+e.n-r.at <= maxRun {
				r.ext = append(r.ext, e)
				continue
			}
		}
		out = append(out, readRun{pack: e.pack, at: e.at, ext: []placed{e}})
	}
	return out
}

// place finds where each of exts is, skipping the places skip names (a
// copy found missing or damaged): the indexes are read again once when
// fresh or when an extent is found nowhere. It returns those found, and
// those found nowhere.
func (s *Store) place(m *Manifest, exts []Extent, skip map[loc]bool, fresh bool) (found []placed, missing []Extent, err error) {
	if fresh {
		err = s.reload()
	} else {
		err = s.loadIndex()
	}
	if err != nil {
		return nil, nil, err
	}
	for {
		missing = nil
		for _, e := range exts {
			if l, ok := s.pick(e.Digest, e.Len(m.Size), skip); ok {
				found = append(found, placed{e, l})
			} else {
				missing = append(missing, e)
			}
		}
		if len(missing) == 0 || fresh {
			return found, missing, nil
		}
		if err := s.reload(); err != nil { // a pack written since the indexes were read
			return nil, nil, err
		}
		fresh, exts = true, missing
	}
}

// each reads every extent m names from the store, checks it against its
// digest and hands it to f (the bytes are f's only during the call; f is
// called from several goroutines at once). Extents with one digest hold
// the same bytes: each digest is read and checked once, and handed to f
// at every extent that names it. A copy that is missing or does not
// match sends the extent to another copy (the indexes read again); an
// extent no copy of which is whole is a Damage, handed to bad.
func (s *Store) each(ctx context.Context, m *Manifest, f func(e Extent, b []byte) error, bad func(Damage) error) error {
	pending, named := byDigest(m.Extents) // named: read-only from here
	everywhere := func(e Extent, b []byte) error {
		for _, at := range named[e.Digest] {
			if err := f(at, b); err != nil {
				return err
			}
		}
		return nil
	}
	skip := map[loc]bool{}
	failed := map[Digest]Damage{} // each digest's last copy that failed
	packs := &openPacks{s: s, files: map[string]*os.File{}}
	defer packs.close()
	for try := 0; len(pending) > 0; try++ {
		found, missing, err := s.place(m, pending, skip, try > 0)
		if err != nil {
			return err
		}
		for _, e := range missing {
			d, ok := failed[e.Digest]
			if !ok {
				d = Damage{Digest: e.Digest, Detail: "no pack holds it"}
			}
			for _, at := range named[e.Digest] {
				d.Off = at.Off()
				if err := bad(d); err != nil {
					return err
				}
			}
		}
		pending = nil
		var mu sync.Mutex // pending, skip, failed
		err = readRuns(ctx, runs(found), func(r readRun, buf []byte) error {
			return packs.readRun(r, buf, everywhere, func(e placed, detail string) {
				if detail != packMissing {
					s.markDamaged(e.Digest)
				}
				mu.Lock()
				defer mu.Unlock()
				skip[e.loc] = true
				failed[e.Digest] = Damage{Digest: e.Digest, Pack: r.pack, At: e.at, Detail: detail}
				pending = append(pending, e.Extent)
			})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// byDigest is exts' first extent of each digest, and every extent of
// exts by digest.
func byDigest(exts []Extent) ([]Extent, map[Digest][]Extent) {
	var first []Extent
	named := make(map[Digest][]Extent, len(exts))
	for _, e := range exts {
		if _, ok := named[e.Digest]; !ok {
			first = append(first, e)
		}
		named[e.Digest] = append(named[e.Digest], e)
	}
	return first, named
}

// readers is how many runs a read of a manifest reads at once: on the
// volume, a read that misses the cache waits on the object store, and
// the digests keep a core busy each.
const readers = 4

// readRuns calls read for every run, from readers goroutines, each with
// a buffer of its own; the first error ends it.
func readRuns(ctx context.Context, rs []readRun, read func(readRun, []byte) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(readers, len(rs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, maxRun)
			for {
				i := next.Add(1) - 1
				if i >= int64(len(rs)) || ctx.Err() != nil {
					return
				}
				if err := read(rs[i], buf); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}

// packMissing: the collector moved the extent and removed its pack.
const packMissing = "its pack is missing"

// openPacks are the packs one read of a manifest opened, each once: on
// the volume, an open and a close are round trips to its metadata
// engine, and a manifest's extents lie in runs of a few pages each when
// its memory shares most of them with other snapshots.
type openPacks struct {
	s     *Store
	mu    sync.Mutex
	files map[string]*os.File // nil: the pack is missing
}

func (p *openPacks) open(name string) (*os.File, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.files[name]; ok {
		return f, nil
	}
	f, err := os.Open(p.s.packPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		p.files[name] = nil
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	p.files[name] = f
	return f, nil
}

func (p *openPacks) close() {
	for _, f := range p.files {
		if f != nil {
			f.Close()
		}
	}
}

// readRun reads one run and hands its extents to f; those it cannot (the
// pack is gone, or too short, or they do not match their digests) to
// retry, with why.
func (p *openPacks) readRun(r readRun, buf []byte, f func(Extent, []byte) error, retry func(e placed, detail string)) error {
	pack, err := p.open(r.pack)
	if err != nil {
		return fmt.Errorf("read memory: %w", err)
	}
	if pack == nil {
		for _, e := range r.ext {
			retry(e, packMissing)
		}
		return nil
	}
	last := r.ext[len(r.ext)-1]
	n := last.at + last.n - r.at
	got, rerr := pack.ReadAt(buf[:n], r.at)
	if rerr != nil && !errors.Is(rerr, io.EOF) {
		return fmt.Errorf("read memory: pack %s: %w", r.pack, rerr)
	}
	for _, e := range r.ext {
		lo, l := e.at-r.at, e.n
		switch {
		case int64(got) < lo+l:
			retry(e, "its pack is too short")
		case Digest(blake3.Sum256(buf[lo:lo+l])) != e.Digest:
			retry(e, "does not match its digest")
		default:
			if err := f(e.Extent, buf[lo:lo+l]); err != nil {
				return err
			}
		}
	}
	return nil
}

// openRAM opens the file at dst for writing, made size bytes long if it
// is shorter.
func openRAM(dst string, size int64) (*os.File, error) {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || st.Size() < size {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Fill writes the memory m describes into the file at dst, which is made
// m.Size bytes long if it is shorter (a RAM file made empty at the
// guest's size, or a new file): its extents are read from the store and
// checked against their digests; the pieces that hold zeros are not
// written. Damage fails it with an error that wraps ErrDamaged.
func (s *Store) Fill(ctx context.Context, m *Manifest, dst string) error {
	f, err := openRAM(dst, m.Size)
	if err != nil {
		return fmt.Errorf("fill memory: %w", err)
	}
	defer f.Close()
	err = s.each(ctx, m, func(e Extent, b []byte) error {
		_, err := f.WriteAt(b, e.Off())
		return err
	}, func(d Damage) error { return d })
	if err != nil {
		return fmt.Errorf("fill memory: %w", err)
	}
	return f.Close()
}

// Verify reads every extent m names and returns those missing or not
// matching their digests (nil: none).
func (s *Store) Verify(ctx context.Context, m *Manifest) ([]Damage, error) {
	var bad []Damage
	err := s.each(ctx, m, func(Extent, []byte) error { return nil }, func(d Damage) error {
		bad = append(bad, d)
		return nil
	})
	return bad, err
}

// VerifyCopy checks a local copy of the memory m describes (a file of
// m.Size bytes): every extent m names must match its digest there. It
// returns the first that does not, as a Damage.
func VerifyCopy(ctx context.Context, m *Manifest, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != m.Size {
		return fmt.Errorf("local memory copy %s: not %d bytes: %w", path, m.Size, ErrDamaged)
	}
	// On every core: a restore waits for this (64 KiB BLAKE3s run at
	// 2.6 GB/s per core here).
	workers := min(runtime.NumCPU(), 4)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, ExtentSize)
			for i := w; i < len(m.Extents); i += workers {
				e := m.Extents[i]
				if err := ctx.Err(); err != nil {
					errs[w] = err
					return
				}
				l := e.Len(m.Size)
				if _, err := f.ReadAt(buf[:l], e.Off()); err != nil && !errors.Is(err, io.EOF) {
					errs[w] = err
					return
				}
				if Digest(blake3.Sum256(buf[:l])) != e.Digest {
					errs[w] = Damage{Off: e.Off(), Digest: e.Digest, Detail: "the local copy does not match its digest"}
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// regionSize is the piece a local copy's own sums cover.
const regionSize = 4 << 20

// CopySums are the XXH3-128 sums of a local copy's 4 MiB regions that
// hold data, by region: made when the copy is (from the same paused RAM
// as the snapshot's manifest), they show later that it has not changed.
// A local copy is den's own file on the host's disk: what could change it
// is that disk, not a guest, so a fast non-cryptographic sum serves. A
// check of a 512 MiB guest's copy against its manifest (BLAKE3 of every
// 64 KiB extent) took 200-260 ms of a wake here, beside the VMM's start.
type CopySums map[int64]xxh3.Uint128

// SumCopy makes the sums of the local copy at path.
func SumCopy(ctx context.Context, path string) (CopySums, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	ranges, _, err := sparse.DataRanges(path)
	if err != nil {
		return nil, err
	}
	sums := CopySums{}
	buf := make([]byte, regionSize)
	for _, r := range ranges {
		for i := r.Off / regionSize; i*regionSize < r.Off+r.Len; i++ {
			if _, done := sums[i]; done {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			n := min(regionSize, st.Size()-i*regionSize)
			if _, err := f.ReadAt(buf[:n], i*regionSize); err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			sums[i] = xxh3.Hash128(buf[:n])
		}
	}
	return sums, nil
}

// CheckCopy says whether the local copy at path still has the sums it was
// made with, and the size of m's memory.
func CheckCopy(ctx context.Context, m *Manifest, path string, sums CopySums) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != m.Size {
		return false
	}
	// Every extent m names must be in a summed region.
	for _, e := range m.Extents {
		if _, ok := sums[e.Off()/regionSize]; !ok {
			return false
		}
	}
	buf := make([]byte, regionSize)
	for i, d := range sums {
		if ctx.Err() != nil {
			return false
		}
		n := min(regionSize, m.Size-i*regionSize)
		if _, err := f.ReadAt(buf[:n], i*regionSize); err != nil && !errors.Is(err, io.EOF) {
			return false
		}
		if xxh3.Hash128(buf[:n]) != d {
			return false
		}
	}
	return true
}

// Wanted is the extents a fill reads of m: the first of each digest, in
// m's order. A stream FillFrom reads holds their bytes in that order.
func Wanted(m *Manifest) []Extent {
	first, _ := byDigest(m.Extents)
	return first
}

// FillFrom writes the memory m describes into the file at dst, as Fill
// does, from r: the bytes of Wanted(m), back to back (another host's
// local copy of the memory). Each extent is checked against its digest
// and written at every place m names it, by readers goroutines while r
// is read (a stream that is also an io.Closer is closed when they fail).
// A stream that ends early, or holds an extent that does not match,
// fails it: the caller fills from the store then, which writes every
// extent again.
func FillFrom(ctx context.Context, m *Manifest, dst string, r io.Reader) error {
	f, err := openRAM(dst, m.Size)
	if err != nil {
		return fmt.Errorf("fill memory: %w", err)
	}
	defer f.Close()
	first, named := byDigest(m.Extents)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if c, ok := r.(io.Closer); ok {
		// A checker that fails ends a read that waits on the stream.
		defer context.AfterFunc(ctx, func() { c.Close() })()
	}
	// Batches of extents go from the reader to the checkers and back.
	const batch = 16
	type piece struct {
		ext []Extent
		buf []byte
	}
	free := make(chan *piece, 2*readers)
	for range cap(free) {
		free <- &piece{buf: make([]byte, batch*ExtentSize)}
	}
	full := make(chan *piece)
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range full {
				at := 0
				for _, e := range p.ext {
					b := p.buf[at : at+int(e.Len(m.Size))]
					at += len(b)
					if Digest(blake3.Sum256(b)) != e.Digest {
						cancel(fmt.Errorf("extent at %d MiB does not match its digest", e.Off()>>20))
						break
					}
					for _, x := range named[e.Digest] {
						if _, err := f.WriteAt(b, x.Off()); err != nil {
							cancel(err)
							break
						}
					}
				}
				free <- p
			}
		}()
	}
	var rerr error
read:
	for i := 0; i < len(first); i += batch {
		var p *piece
		select {
		case p = <-free:
		case <-ctx.Done():
			break read
		}
		p.ext = first[i:min(i+batch, len(first))]
		n := 0
		for _, e := range p.ext {
			n += int(e.Len(m.Size))
		}
		if _, err := io.ReadFull(r, p.buf[:n]); err != nil {
			rerr = fmt.Errorf("extents from %d MiB: %w", p.ext[0].Off()>>20, err)
			break
		}
		select {
		case full <- p:
		case <-ctx.Done():
			break read
		}
	}
	close(full)
	wg.Wait()
	if err := errors.Join(rerr, context.Cause(ctx)); err != nil {
		return fmt.Errorf("fill memory: %w", err)
	}
	return f.Close()
}

// SendCopy writes to w the extents idx (indexes, not offsets) of the
// local copy at path of a memory of size bytes, back to back: what
// FillFrom reads on another host.
func SendCopy(ctx context.Context, path string, size int64, idx []int64, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != size {
		return fmt.Errorf("local memory copy %s: not %d bytes", path, size)
	}
	buf := make([]byte, ExtentSize)
	for _, i := range idx {
		if err := ctx.Err(); err != nil {
			return err
		}
		e := Extent{Index: i}
		if i < 0 || e.Off() >= size {
			return fmt.Errorf("local memory copy: extent %d is outside a memory of %d bytes", i, size)
		}
		b := buf[:e.Len(size)]
		if n, err := f.ReadAt(b, e.Off()); n < len(b) {
			return fmt.Errorf("local memory copy %s: %w", path, err)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}
