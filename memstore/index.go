package memstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/denhq/den/internal/atomicfile"
)

// idxSuffix ends a pack's index file's name.
const idxSuffix = ".idx"

// packIndex is a pack's index file: its extents, by digest.
type packIndex struct {
	Version int        `json:"version"`
	Extents []idxEntry `json:"extents"`
}

type idxEntry struct {
	Digest Digest `json:"d"`
	At     int64  `json:"a"`
	Len    int64  `json:"n"`
}

// loc is where an extent is.
type loc struct {
	pack  string
	at, n int64
}

// index maps digests to the packs that hold them (a digest may be in
// several: moved by the collector, or written again after its first copy
// was found damaged), from the packs' index files; it is read again when
// a digest is not in it, or a pack it names is gone.
type index struct {
	mu     sync.Mutex
	where  map[Digest][]loc
	loaded bool
}

func (s *Store) idxPath(name string) string { return s.packPath(name) + idxSuffix }

// readPackIndex reads the index file of pack name.
func (s *Store) readPackIndex(name string) (*packIndex, error) {
	data, err := os.ReadFile(s.idxPath(name))
	if err != nil {
		return nil, err
	}
	var pi packIndex
	if err := json.Unmarshal(data, &pi); err != nil {
		return nil, fmt.Errorf("pack index %s: %w", name, err)
	}
	return &pi, nil
}

// listPacks lists the packs that have an index (complete ones), and
// those without one (a crash between the pack and its index).
func (s *Store) listPacks() (indexed, bare []string, err error) {
	ents, err := os.ReadDir(filepath.Join(s.root, "packs"))
	if err != nil {
		return nil, nil, err
	}
	has := map[string]bool{}
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), idxSuffix); ok && validPack(name) {
			has[name] = true
		}
	}
	for _, e := range ents {
		switch name := e.Name(); {
		case !validPack(name):
		case has[name]:
			indexed = append(indexed, name)
		default:
			bare = append(bare, name)
		}
	}
	return indexed, bare, nil
}

// reload reads every pack's index again.
func (s *Store) reload() error {
	packs, _, err := s.listPacks()
	if err != nil {
		return err
	}
	where := map[Digest][]loc{}
	for _, name := range packs {
		pi, err := s.readPackIndex(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		for _, e := range pi.Extents {
			where[e.Digest] = append(where[e.Digest], loc{name, e.At, e.Len})
		}
	}
	s.idx.mu.Lock()
	s.idx.where, s.idx.loaded = where, true
	s.idx.mu.Unlock()
	return nil
}

// loadIndex reads the packs' indexes unless they were read already.
func (s *Store) loadIndex() error {
	s.idx.mu.Lock()
	loaded := s.idx.loaded
	s.idx.mu.Unlock()
	if loaded {
		return nil
	}
	return s.reload()
}

// pick is a place of digest d, n bytes long, that skip does not name.
func (s *Store) pick(d Digest, n int64, skip map[loc]bool) (loc, bool) {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	for _, l := range s.idx.where[d] {
		if l.n == n && !skip[l] {
			return l, true
		}
	}
	return loc{}, false
}

// learn adds a pack just written to the index.
func (s *Store) learn(name string, entries []idxEntry) {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	if !s.idx.loaded {
		return // the first lookup reads every index
	}
	for _, e := range entries {
		s.idx.where[e.Digest] = append(s.idx.where[e.Digest], loc{name, e.At, e.Len})
	}
}

// forget drops a removed pack from the index.
func (s *Store) forget(name string) {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	for d, ls := range s.idx.where {
		kept := ls[:0]
		for _, l := range ls {
			if l.pack != name {
				kept = append(kept, l)
			}
		}
		if len(kept) == 0 {
			delete(s.idx.where, d)
		} else {
			s.idx.where[d] = kept
		}
	}
}

// Place is where a copy of an extent is: its pack, and its offset there.
type Place struct {
	Pack string
	At   int64
}

// Places are every copy of the extent with digest d (for tests and
// tools).
func (s *Store) Places(d Digest) []Place {
	if err := s.reload(); err != nil {
		return nil
	}
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	var out []Place
	for _, l := range s.idx.where[d] {
		out = append(out, Place{l.pack, l.at})
	}
	return out
}

// Locate says which pack holds the extent with digest d, and where in
// it (for tests and tools).
func (s *Store) Locate(d Digest) (pack string, at int64, ok bool) {
	if err := s.reload(); err != nil {
		return "", 0, false
	}
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	if ls := s.idx.where[d]; len(ls) > 0 {
		return ls[0].pack, ls[0].at, true
	}
	return "", 0, false
}

// writeIndex writes pack name's index into tmp/, synced, and returns
// its path there.
func (s *Store) writeIndex(name string, entries []idxEntry) (string, error) {
	data, err := json.Marshal(packIndex{Version: version, Extents: entries})
	if err != nil {
		return "", err
	}
	tmp := filepath.Join(s.root, "tmp", name+idxSuffix)
	if err := atomicfile.Write(tmp, data, 0o600); err != nil {
		return "", err
	}
	return tmp, nil
}
