// Package memstore keeps snapshots' guest memory by content: extents
// named by their BLAKE3 digest, packed into immutable files on the volume
// that the manifests of every checkpoint, suspend slot, warm base and fork
// share, with what no manifest names collected.
//
// A snapshot's memory is a manifest (ManifestFile, in its VMM directory):
// the memory's size and, for each ExtentSize piece that holds data, its
// digest. Pieces that are all zeros are not stored. A new snapshot hashes
// the RAM and stores only the pieces its origin's manifest (the snapshot
// the RAM last equalled) does not name, in one new pack; the rest it names
// by digest. There is no parent chain: a manifest names every piece it
// needs, so deleting any other snapshot never makes it unrestorable.
//
// A pack is its extents back to back (packs/NAME) and an index of them
// (packs/NAME.idx: digest, offset, length); where a digest is comes from
// the indexes, never from a manifest, so that the collector may move the
// live extents of a pack that is mostly dead into a new pack and remove
// the old one without touching any manifest.
//
// Writes are ordered so that a crash leaves at worst an unreferenced
// pack: a pack and its index are written and synced before the manifest
// that names their digests. Collect decides, under the store's exclusive
// lock, what goes: packs none of whose digests a manifest on the volume
// names, and live extents of packs mostly dead, to be moved; a writer holds
// the shared lock from the moment it trusts its origin's manifest (still
// there) until its own manifest is in place. Packs younger than a grace
// period are never touched.
package memstore

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/denhq/den/internal/atomicfile"
)

const (
	// ManifestFile is a snapshot's memory manifest, in the directory the
	// VMM's snapshot is in.
	ManifestFile = "memory.manifest"
	// ExtentSize is the piece of memory one digest names. Chosen from the
	// pages an idle 512 MiB guest (96 MiB of data) changed between two
	// checkpoints 5 s apart (110-233 pages): 64 KiB pieces store 4-8 MiB
	// of them, 256 KiB 12-20 MiB, 1 MiB 28-41 MiB, 4 MiB 60-80 MiB; 16 KiB
	// would store 1.4-3 MiB but four times as many pieces to hash, list
	// and read (docs/storage.md).
	ExtentSize = 64 << 10
	// Algorithm names the digest.
	Algorithm = "blake3-256"
	version   = 2
)

// Manifest is a snapshot's memory, by content.
type Manifest struct {
	Version    int    `json:"version"`
	Algorithm  string `json:"algorithm"`
	ExtentSize int64  `json:"extent_size"`
	// Size is the memory's size in bytes (the guest's RAM).
	Size int64 `json:"size"`
	// Extents are the pieces that hold data, by increasing Index; every
	// other piece is zeros.
	Extents []Extent `json:"extents"`
}

// Extent is one piece of memory that holds data.
type Extent struct {
	// Index is the piece's offset in the memory over ExtentSize.
	Index int64 `json:"i"`
	// Digest is the BLAKE3-256 of the piece's bytes.
	Digest Digest `json:"d"`
}

// Digest is a BLAKE3-256 digest.
type Digest [32]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// MarshalText writes d in hex.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads d from hex.
func (d *Digest) UnmarshalText(b []byte) error {
	if hex.DecodedLen(len(b)) != len(d) {
		return fmt.Errorf("digest %q: not %d bytes of hex", b, len(d))
	}
	_, err := hex.Decode(d[:], b)
	return err
}

// Off is where e starts in the memory; Len is how long it is in a memory
// of size bytes.
func (e Extent) Off() int64           { return e.Index * ExtentSize }
func (e Extent) Len(size int64) int64 { return min(ExtentSize, size-e.Off()) }

// Bytes is the data the manifest names (its extents' bytes).
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, e := range m.Extents {
		n += e.Len(m.Size)
	}
	return n
}

// check says whether m is a manifest this package reads.
func (m *Manifest) check() error {
	if m.Version != version || m.Algorithm != Algorithm || m.ExtentSize != ExtentSize {
		return fmt.Errorf("memory manifest: version %d, %s, extents of %d bytes: not one this den reads", m.Version, m.Algorithm, m.ExtentSize)
	}
	last := int64(-1)
	for _, e := range m.Extents {
		if e.Index <= last || e.Off() >= m.Size {
			return fmt.Errorf("memory manifest: extent %d out of place", e.Index)
		}
		last = e.Index
	}
	return nil
}

// ErrNoManifest says that a snapshot directory holds no memory manifest:
// its memory is a file of its own (a snapshot taken before den stored
// memory by content, or by a VMM that writes its own).
var ErrNoManifest = errors.New("no memory manifest")

// ReadManifest reads the manifest in the snapshot directory dir.
func ReadManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoManifest)
	}
	if err != nil {
		return nil, err
	}
	return parseManifest(data)
}

func parseManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("memory manifest: %w", err)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// WriteManifest writes m into the snapshot directory dir through a
// temporary file and a rename, not synced: the caller syncs the snapshot
// directory once it is whole, as it does the VMM's files.
func WriteManifest(dir string, m *Manifest) error {
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("write memory manifest: %w", err)
	}
	return atomicfile.Replace(filepath.Join(dir, ManifestFile), data, 0o600)
}
