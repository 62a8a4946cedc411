package memstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"lukechampine.com/blake3"
)

// ErrDamaged is wrapped by every error that reports an extent not
// matching its digest, or missing.
var ErrDamaged = errors.New("damaged")

// Damage names an extent of a manifest that is missing or does not match
// its digest.
type Damage struct {
	Pack   string
	At     int64 // in the pack
	Off    int64 // in the memory
	Digest Digest
	Detail string
}

func (d Damage) Error() string {
	return fmt.Sprintf("memory at %d MiB (pack %s, offset %d): %s", d.Off>>20, d.Pack, d.At, d.Detail)
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

// readRun is a run of a manifest's extents that lie back to back in one
// pack: read with one call.
type readRun struct {
	pack string
	at   int64
	ext  []Extent
}

// runs groups m's extents by pack, in the pack's order, into runs of
// back-to-back extents of at most maxRun bytes.
func runs(m *Manifest) []readRun {
	ext := append([]Extent(nil), m.Extents...)
	sort.Slice(ext, func(i, j int) bool {
		if ext[i].Pack != ext[j].Pack {
			return ext[i].Pack < ext[j].Pack
		}
		return ext[i].At < ext[j].At
	})
	const maxRun = 4 << 20
	var out []readRun
	for _, e := range ext {
		if k := len(out); k > 0 {
			r := &out[k-1]
			last := r.ext[len(r.ext)-1]
			if last.Pack == e.Pack && last.At+last.Len(m.Size) == e.At && e.At+e.Len(m.Size)-r.at <= maxRun {
				r.ext = append(r.ext, e)
				continue
			}
		}
		out = append(out, readRun{pack: m.Packs[e.Pack], at: e.At, ext: []Extent{e}})
	}
	return out
}

// each reads every extent m names from the store, in the packs' order,
// checks it against its digest and hands it to f (the bytes are f's only
// during the call). A missing pack or a mismatch is a Damage, handed to
// bad; each returns the first error of f or bad.
func (s *Store) each(ctx context.Context, m *Manifest, f func(e Extent, b []byte) error, bad func(Damage) error) error {
	buf := make([]byte, 4<<20)
	var pack *os.File
	var packName string
	defer func() {
		if pack != nil {
			pack.Close()
		}
	}()
	for _, r := range runs(m) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.pack != packName {
			if pack != nil {
				pack.Close()
				pack = nil
			}
			packName = r.pack
			p, err := os.Open(s.packPath(r.pack))
			if err == nil {
				pack = p
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("read memory: %w", err)
			}
		}
		last := r.ext[len(r.ext)-1]
		n := last.At + last.Len(m.Size) - r.at
		var got int
		var rerr error
		if pack != nil {
			got, rerr = pack.ReadAt(buf[:n], r.at)
			if rerr != nil && !errors.Is(rerr, io.EOF) {
				return fmt.Errorf("read memory: pack %s: %w", r.pack, rerr)
			}
		}
		for _, e := range r.ext {
			lo, l := e.At-r.at, e.Len(m.Size)
			dmg := Damage{Pack: r.pack, At: e.At, Off: e.Off(), Digest: e.Digest}
			switch {
			case pack == nil:
				dmg.Detail = "its pack is missing"
			case int64(got) < lo+l:
				dmg.Detail = "its pack is too short"
			case Digest(blake3.Sum256(buf[lo:lo+l])) != e.Digest:
				dmg.Detail = "does not match its digest"
			default:
				if err := f(e, buf[lo:lo+l]); err != nil {
					return err
				}
				continue
			}
			if err := bad(dmg); err != nil {
				return err
			}
		}
	}
	return nil
}

// Fill writes the memory m describes into the file at dst, which is made
// m.Size bytes long if it is shorter (a RAM file made empty at the
// guest's size, or a new file): its extents are read from the store and
// checked against their digests; the pieces that hold zeros are not
// written. Damage fails it with an error that wraps ErrDamaged.
func (s *Store) Fill(ctx context.Context, m *Manifest, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("fill memory: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() < m.Size {
		if err := f.Truncate(m.Size); err != nil {
			return fmt.Errorf("fill memory: %w", err)
		}
	}
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
	buf := make([]byte, ExtentSize)
	for _, e := range m.Extents {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := e.Len(m.Size)
		if _, err := f.ReadAt(buf[:l], e.Off()); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if Digest(blake3.Sum256(buf[:l])) != e.Digest {
			return Damage{Off: e.Off(), Digest: e.Digest, Detail: "the local copy does not match its digest"}
		}
	}
	return nil
}
