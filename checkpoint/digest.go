package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/sparse"
)

// Digests make damage to a snapshot visible: every file of a checkpoint
// or suspend slot has BLAKE3 digests, one per ExtentSize piece, in a
// manifest beside it. Small files (device state, VMM config) are digested
// when the snapshot is taken; large ones (guest memory, the disk) by
// Seal afterwards, off the critical path of checkpoint and sleep, into a
// second file tied to the first by a random seal id, so that a late
// sealer can never vouch for a newer snapshot in the same place.
//
// BLAKE3 was measured against SHA-256 (SHA-NI), xxHash64 and XXH3 on this
// machine (4 MiB buffers, one core): SHA-256 1.45 GB/s, BLAKE3 3.2 GB/s
// (github.com/zeebo/blake3), xxHash64 12 GB/s, XXH3 54 GB/s. Reading through the FUSE volume costs
// more than BLAKE3 does, and BLAKE3 also holds against deliberate edits.
const (
	// ManifestFile holds the digests of the small files and names the
	// large ones.
	ManifestFile = "digests.json"
	// Algorithm names the digest.
	Algorithm = "blake3-256"
	// ExtentSize is the piece of a file one digest covers.
	ExtentSize = 4 << 20
	// SmallFile is the size up to which a file is digested with the take
	// and always verified whole.
	SmallFile = 8 << 20
)

// largeManifest is the file holding the large files' digests for seal id.
func largeManifest(seal string) string { return "digests-" + seal + ".json" }

// Manifest lists the digests of a snapshot directory's files.
type Manifest struct {
	Algorithm  string `json:"algorithm"`
	ExtentSize int64  `json:"extent_size"`
	// Seal ties the large files' digests to this manifest.
	Seal string `json:"seal"`
	// Files are the digests known, by slash path relative to the
	// directory.
	Files map[string]FileDigest `json:"files"`
	// Large are the files whose digests Seal computes, with their sizes.
	Large map[string]int64 `json:"large,omitempty"`
}

// FileDigest is one file's size and per-extent digests.
type FileDigest struct {
	Size    int64    `json:"size"`
	Extents []string `json:"extents"`
}

// ErrDamaged is wrapped by every error that reports a file not matching
// its digest.
var ErrDamaged = errors.New("damaged")

// ErrUnsealed says that a snapshot has no digests (taken before den kept
// them): it cannot be verified.
var ErrUnsealed = errors.New("no digests recorded")

// DamageError names the file, and the extent, that do not match.
type DamageError struct {
	File   string
	Extent int   // -1: the whole file (missing, or of another size)
	Offset int64 // of the extent
	Detail string
}

func (e *DamageError) Error() string {
	if e.Extent < 0 {
		return fmt.Sprintf("%s %s", e.File, e.Detail)
	}
	// Extents start on a MiB boundary.
	return fmt.Sprintf("%s extent %d (offset %d MiB) does not match its digest", e.File, e.Extent, e.Offset>>20)
}

func (e *DamageError) Unwrap() error { return ErrDamaged }

// DataRanges tells which ranges of the file at path hold data, in order
// (storage.Volume.DataRanges, SEEK_DATA); ok false: it cannot tell. An
// extent outside them reads as zeros, so its digest is that of zeros,
// known without a read: a checkpoint's disk of 4 GiB holds some 60-200
// MiB of data here, its memory file of 512 MiB 110-190 MiB.
type DataRanges func(path string) (ext []sparse.Extent, ok bool)

// dataMap answers whether an extent of one file holds data.
type dataMap struct {
	ext   []sparse.Extent
	known bool
}

// mapData is the data map of path (nothing known without ranges).
func mapData(ranges DataRanges, path string) dataMap {
	if ranges == nil {
		return dataMap{}
	}
	ext, ok := ranges(path)
	return dataMap{ext: ext, known: ok}
}

// hole says that n bytes at off hold no data: they read as zeros.
func (d dataMap) hole(off, n int64) bool {
	if !d.known || n <= 0 {
		return false
	}
	i := sort.Search(len(d.ext), func(i int) bool { return d.ext[i].Off+d.ext[i].Len > off })
	return i == len(d.ext) || d.ext[i].Off >= off+n
}

// Pace is how a background seal shares the host.
type Pace struct {
	// Idle: after each extent, rest Idle times as long as it took.
	Idle float64
	// Yield, when set, is called before each extent and returns when
	// the seal may go on (it waits while the host has better things to
	// do).
	Yield func(ctx context.Context)
	// Data, when set, tells the holes of a file: their extents are
	// digested as zeros, not read.
	Data DataRanges
	// ReadDir, when set, is the snapshot's directory as read (the same
	// files through the volume's read-only mount, whose reads leave a
	// clone's data as it is): the large files are read there.
	ReadDir string
}

// hashExtents reads r (size bytes) and returns one digest per extent,
// paced by p; the extents data says are holes are not read.
func hashExtents(ctx context.Context, r io.ReaderAt, n int64, data dataMap, p Pace) ([]string, error) {
	count := 1 // an empty file has the digest of nothing
	if n > 0 {
		count = int((n + ExtentSize - 1) / ExtentSize)
	}
	out := make([]string, count)
	for i := range out {
		if off := int64(i) * ExtentSize; data.hole(off, min(ExtentSize, n-off)) {
			out[i] = zeroDigest(min(ExtentSize, n-off))
		}
	}
	if err := hashInto(ctx, r, n, out, func(i int) bool { return out[i] == "" }, p); err != nil {
		return nil, err
	}
	return out, nil
}

// hashInto reads the extents of r (n bytes) that want picks and puts
// their digests in out, paced by p.
func hashInto(ctx context.Context, r io.ReaderAt, n int64, out []string, want func(i int) bool, p Pace) error {
	var buf []byte
	for i := range out {
		if !want(i) {
			continue
		}
		if p.Yield != nil {
			p.Yield(ctx)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if buf == nil {
			buf = make([]byte, 1<<20)
		}
		start := time.Now()
		off := int64(i) * ExtentSize
		d, err := hashExtent(r, off, min(ExtentSize, n-off), buf)
		if err != nil {
			return err
		}
		out[i] = d
		if p.Idle > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(float64(time.Since(start)) * p.Idle)):
			}
		}
	}
	return ctx.Err()
}

// hashExtent digests n bytes of r at off.
func hashExtent(r io.ReaderAt, off, n int64, buf []byte) (string, error) {
	h := blake3.New()
	for done := int64(0); done < n; {
		k := min(int64(len(buf)), n-done)
		got, err := r.ReadAt(buf[:k], off+done)
		h.Write(buf[:got])
		done += int64(got)
		if err != nil && !(errors.Is(err, io.EOF) && done == n) {
			if errors.Is(err, io.EOF) {
				return "", fmt.Errorf("short read at %d", off+done)
			}
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// digestFile digests the file at path.
func digestFile(ctx context.Context, path string, p Pace) (FileDigest, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileDigest{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileDigest{}, err
	}
	var data dataMap
	if p.Data != nil {
		// Asking for the map is work for the volume too: after the
		// yield, like the reads.
		if p.Yield != nil {
			p.Yield(ctx)
		}
		data = mapData(p.Data, path)
	}
	ext, err := hashExtents(ctx, f, st.Size(), data, p)
	if err != nil {
		return FileDigest{}, fmt.Errorf("digest %s: %w", path, err)
	}
	// The map is asked again, and the extents digested as holes that it
	// now says hold data are read: a map that missed data (JuiceFS answers
	// a chunk it failed to list as no slices, not as an error) would
	// record zeros for it for good. JuiceFS's compaction, which the reads
	// start, turns holes between slices into data (zeros) too: those
	// reads find the zeros.
	if data.known {
		after, n := mapData(p.Data, path), st.Size()
		filled := func(i int) bool {
			off := int64(i) * ExtentSize
			return data.hole(off, min(ExtentSize, n-off)) && !after.hole(off, min(ExtentSize, n-off))
		}
		if err := hashInto(ctx, f, n, ext, filled, p); err != nil {
			return FileDigest{}, fmt.Errorf("digest %s: %w", path, err)
		}
	}
	return FileDigest{Size: st.Size(), Extents: ext}, nil
}

// isManifest says whether a file name is one of the digest files.
func isManifest(name string) bool {
	return name == ManifestFile || (strings.HasPrefix(name, "digests-") && strings.HasSuffix(name, ".json"))
}

// skipped are files that are not part of a snapshot's content.
func skipped(name string) bool {
	return isManifest(name) || name == MetaFile || name == DamagedFile || strings.HasPrefix(name, ".tmp")
}

// SealSmall writes dir's manifest: digests of its small files now, and
// the names and sizes of the large ones for Seal. Digests found in a
// sealed subdirectory (a suspend slot cloned into a checkpoint) are taken
// over instead of read again.
func SealSmall(ctx context.Context, dir string) (Manifest, error) {
	seal, err := randomID()
	if err != nil {
		return Manifest{}, err
	}
	man := Manifest{Algorithm: Algorithm, ExtentSize: ExtentSize, Seal: seal, Files: map[string]FileDigest{}, Large: map[string]int64{}}
	inherited := map[string]FileDigest{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." {
				sub, err := ReadManifest(path)
				if err == nil {
					for f, fd := range sub.Files {
						inherited[rel+"/"+f] = fd
					}
				}
			}
			return nil
		}
		if skipped(d.Name()) || !d.Type().IsRegular() {
			return nil
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		if fd, ok := inherited[rel]; ok && fd.Size == st.Size() {
			man.Files[rel] = fd
			return nil
		}
		if st.Size() > SmallFile {
			man.Large[rel] = st.Size()
			return nil
		}
		fd, err := digestFile(ctx, path, Pace{})
		if err != nil {
			return err
		}
		man.Files[rel] = fd
		return nil
	})
	if err != nil {
		return man, fmt.Errorf("digest snapshot: %w", err)
	}
	if err := atomicfile.WriteJSON(filepath.Join(dir, ManifestFile), man, 0o600); err != nil {
		return man, fmt.Errorf("digest snapshot: %w", err)
	}
	return man, nil
}

// Seal digests the large files SealSmall left to it and records them for
// the manifest's seal id. It is safe to run late, or twice, or against a
// directory replaced meanwhile (its digests then name another seal).
// p paces it, so that a background seal leaves the host's CPU and I/O
// to the VMs and to the operations on them. local maps files (slash
// paths) to host paths holding the same bytes (a local copy of the
// memory, made from the same paused RAM), read in their place when they
// are there with the recorded size: no read through the volume. They are
// copies of the snapshot sealed localSeal, and are used only while dir
// holds that snapshot: a seal that runs late, when dir (a VM's suspend
// slot) holds a later snapshot of the same size, must not digest an
// older copy for it.
func Seal(ctx context.Context, dir string, p Pace, localSeal string, local map[string]string) error {
	man, err := readManifest(dir)
	if err != nil {
		return err
	}
	if len(man.Large) == 0 {
		return nil
	}
	if localSeal == "" || man.Seal != localSeal {
		local = nil
	}
	if _, err := readLarge(dir, man.Seal); err == nil {
		return nil // sealed already
	}
	large := map[string]FileDigest{}
	for _, rel := range sortedKeys(man.Large) {
		fd, err := FileDigest{}, os.ErrNotExist
		if l := local[rel]; l != "" {
			fd, err = digestFile(ctx, l, p)
		}
		if err != nil || fd.Size != man.Large[rel] {
			from := dir
			if p.ReadDir != "" {
				from = p.ReadDir
			}
			fd, err = digestFile(ctx, filepath.Join(from, filepath.FromSlash(rel)), p)
		}
		if err != nil {
			return fmt.Errorf("seal snapshot: %w", err)
		}
		if fd.Size != man.Large[rel] {
			return fmt.Errorf("seal snapshot: %s changed size (%d, was %d)", rel, fd.Size, man.Large[rel])
		}
		large[rel] = fd
	}
	// The directory may have been replaced while the files were read.
	if now, err := readManifest(dir); err != nil || now.Seal != man.Seal {
		return nil
	}
	if err := atomicfile.WriteJSON(filepath.Join(dir, largeManifest(man.Seal)), large, 0o600); err != nil {
		return fmt.Errorf("seal snapshot: %w", err)
	}
	return nil
}

// Sealed says whether dir's large files have their digests.
func Sealed(dir string) bool {
	man, err := ReadManifest(dir)
	return err == nil && len(man.Large) == 0
}

func readManifest(dir string) (Manifest, error) {
	var man Manifest
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return man, ErrUnsealed
	}
	if err != nil {
		return man, err
	}
	if err := json.Unmarshal(data, &man); err != nil {
		return man, &DamageError{File: ManifestFile, Extent: -1, Detail: "is not valid: " + err.Error()}
	}
	if man.Algorithm != Algorithm || man.ExtentSize != ExtentSize {
		return man, fmt.Errorf("digests in %s: algorithm %q, extent %d: this den knows %s with %d", dir, man.Algorithm, man.ExtentSize, Algorithm, ExtentSize)
	}
	return man, nil
}

func readLarge(dir, seal string) (map[string]FileDigest, error) {
	var large map[string]FileDigest
	data, err := os.ReadFile(filepath.Join(dir, largeManifest(seal)))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &large); err != nil {
		return nil, &DamageError{File: largeManifest(seal), Extent: -1, Detail: "is not valid: " + err.Error()}
	}
	return large, nil
}

// ReadManifest reads dir's manifest with the large files' digests merged
// in where Seal has written them (those still missing stay in Large).
func ReadManifest(dir string) (Manifest, error) {
	man, err := readManifest(dir)
	if err != nil || len(man.Large) == 0 {
		return man, err
	}
	large, err := readLarge(dir, man.Seal)
	if errors.Is(err, os.ErrNotExist) {
		return man, nil
	}
	if err != nil {
		return man, err
	}
	for rel, fd := range large {
		if _, ok := man.Large[rel]; ok {
			man.Files[rel] = fd
			delete(man.Large, rel)
		}
	}
	return man, nil
}

// Policy says how much of a snapshot Verify reads.
type Policy struct {
	// Full reads every extent of every file.
	Full bool
	// Whole lists files (slash paths, a prefix ending in "/", or "" for
	// every file) that are read whole even when Full is not set; small
	// files always are.
	Whole []string
	// Sample is the number of extents read, besides the first and the
	// last, of each other large file.
	Sample int
	// DataOnly: of the files read whole (not Full), the extents that
	// were all zeros when sealed (a sparse memory file's holes, which
	// QEMU's restore does not read: its memory.map lists the data) are
	// sampled instead.
	DataOnly bool
	// Seal, when set, is the seal id recorded elsewhere (the registry)
	// for the snapshot: digests missing, or of another seal, are damage,
	// and so are large files without digests unless Sealing.
	Seal string
	// Sealing: the large files' digests are being written right now.
	Sealing bool
	// Local maps files (slash paths) to host paths read in their place:
	// local copies of them, which the restore reads instead, are checked
	// against the snapshot's digests.
	Local map[string]string
	// Data, when set, tells the holes of a file: an extent in one is
	// checked against the digest of zeros, which is what a read of it
	// returns, without the read.
	Data DataRanges
	// ReadDir, when set, is the snapshot's directory as its large files
	// are read (Pace's); small ones, written once, are read in dir.
	ReadDir string
}

// path is where file rel of the snapshot in dir is read (large: a file
// of over SmallFile bytes).
func (p Policy) path(dir, rel string, large bool) string {
	if l, ok := p.Local[rel]; ok {
		return l
	}
	if p.ReadDir != "" && large {
		dir = p.ReadDir
	}
	return filepath.Join(dir, filepath.FromSlash(rel))
}

func (p Policy) whole(rel string) bool {
	for _, w := range p.Whole {
		if w == "" || rel == w || (strings.HasSuffix(w, "/") && strings.HasPrefix(rel, w)) {
			return true
		}
	}
	return false
}

// FileResult is what Verify found for one file.
type FileResult struct {
	File    string `json:"file"`
	Size    int64  `json:"size"`
	Extents int    `json:"extents"` // how many were checked
	Of      int    `json:"of"`      // how many it has
	// Holes is how many of the extents checked are holes, checked
	// without a read (Policy.Data); ReadBytes is what was read.
	Holes     int   `json:"holes,omitempty"`
	ReadBytes int64 `json:"read_bytes"`
	// Status is "ok", "damaged", "missing" or "unsealed" (its digests
	// are still being computed, or were never).
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Verify checks dir's files against its manifest as p says, and returns
// what it found per file, and the first damage as a *DamageError (or
// ErrUnsealed when dir has no manifest). Every file is checked, so the
// results name all the damage.
func Verify(ctx context.Context, dir string, p Policy) ([]FileResult, error) {
	man, err := ReadManifest(dir)
	if errors.Is(err, ErrUnsealed) && p.Seal != "" {
		return nil, &DamageError{File: ManifestFile, Extent: -1, Detail: "is missing (the digests recorded with the snapshot)"}
	}
	if err != nil {
		return nil, err
	}
	if p.Seal != "" && man.Seal != p.Seal {
		return nil, &DamageError{File: ManifestFile, Extent: -1, Detail: "belongs to another snapshot (seal " + man.Seal + ", recorded " + p.Seal + ")"}
	}
	var out []FileResult
	var first error
	for _, rel := range sortedKeys(man.Files) {
		res, err := verifyFile(ctx, dir, rel, man.Files[rel], p)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		out = append(out, res)
		if err != nil && first == nil {
			first = err
		}
	}
	for _, rel := range sortedKeys(man.Large) {
		res := FileResult{File: rel, Size: man.Large[rel], Status: "unsealed", Detail: "its digests are not written yet"}
		st, err := os.Stat(p.path(dir, rel, true))
		switch {
		case err != nil && !errors.Is(err, os.ErrNotExist):
			return out, err
		case err != nil || st.Size() != man.Large[rel]:
			res.Status, res.Detail = "missing", "is missing or changed size"
		case p.Seal != "" && !p.Sealing:
			// Recorded as sealed, nothing sealing it: its digests are lost.
			res.Status, res.Detail = "damaged", "has no digests ("+largeManifest(man.Seal)+" is missing)"
		}
		if res.Status != "unsealed" && first == nil {
			first = &DamageError{File: rel, Extent: -1, Detail: res.Detail}
		}
		out = append(out, res)
	}
	return out, first
}

func verifyFile(ctx context.Context, dir, rel string, fd FileDigest, p Policy) (FileResult, error) {
	res := FileResult{File: rel, Size: fd.Size, Of: len(fd.Extents), Status: "ok"}
	damaged := func(e *DamageError) (FileResult, error) {
		res.Status, res.Detail = "damaged", e.Error()
		if e.Extent < 0 {
			res.Status, res.Detail = "missing", e.Detail
		}
		return res, e
	}
	f, err := os.Open(p.path(dir, rel, fd.Size > SmallFile))
	if errors.Is(err, os.ErrNotExist) {
		return damaged(&DamageError{File: rel, Extent: -1, Detail: "is missing"})
	}
	if err != nil {
		return res, err // an I/O error says nothing of the data
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return res, err
	}
	if st.Size() != fd.Size {
		return damaged(&DamageError{File: rel, Extent: -1, Detail: fmt.Sprintf("has %d bytes, its digest %d", st.Size(), fd.Size)})
	}
	buf := make([]byte, 1<<20)
	idx := pick(len(fd.Extents), fd.Size <= SmallFile || p.Full || p.whole(rel), p.Sample)
	if p.DataOnly && !p.Full && fd.Size > SmallFile && p.whole(rel) {
		idx = dataExtents(fd, p.Sample)
	}
	var data dataMap
	if fd.Size > SmallFile {
		data = mapData(p.Data, p.path(dir, rel, true))
	}
	for _, i := range idx {
		off := int64(i) * ExtentSize
		n := min(ExtentSize, fd.Size-off)
		var d string
		if data.hole(off, n) && fd.Extents[i] == zeroDigest(n) {
			d = zeroDigest(n)
			res.Holes++
		} else {
			// Data, or a hole where the digest says data: read (a map
			// that missed data must not pass for damage).
			if d, err = hashExtent(f, off, n, buf); err != nil {
				return res, fmt.Errorf("read %s: %w", rel, err)
			}
			res.ReadBytes += max(n, 0)
		}
		res.Extents++
		if d != fd.Extents[i] {
			return damaged(&DamageError{File: rel, Extent: i, Offset: off})
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	return res, nil
}

// dataExtents is the extents of fd that held data when sealed, with a
// sample of the others (the first and the last always).
func dataExtents(fd FileDigest, sample int) []int {
	var out, zeros []int
	for i, d := range fd.Extents {
		n := min(ExtentSize, fd.Size-int64(i)*ExtentSize)
		if d == zeroDigest(n) && i != 0 && i != len(fd.Extents)-1 {
			zeros = append(zeros, i)
			continue
		}
		out = append(out, i)
	}
	for _, k := range pick(len(zeros), false, sample) {
		out = append(out, zeros[k])
	}
	sort.Ints(out)
	return out
}

var zeroDigests sync.Map // extent length -> digest of that many zero bytes

// zeroDigest is the digest of n zero bytes.
func zeroDigest(n int64) string {
	if d, ok := zeroDigests.Load(n); ok {
		return d.(string)
	}
	h := blake3.New()
	h.Write(make([]byte, n))
	d := hex.EncodeToString(h.Sum(nil))
	zeroDigests.Store(n, d)
	return d
}

// pick is the extents to read of n: all, or the first, the last and
// sample others chosen at random.
func pick(n int, all bool, sample int) []int {
	if all || n <= sample+2 {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	seen := map[int]bool{0: true, n - 1: true}
	out := []int{0}
	for len(seen) < sample+2 {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
		if err != nil {
			break
		}
		if i := int(k.Int64()); !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return append(out, n-1)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func randomID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
