package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/denhq/den/internal/sparse"
)

// snapshotDir is a snapshot as the VMMs write it: small state and config
// files, and a sparse memory file of 10 extents with data here and there.
func snapshotDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("vmm/state", strings.Repeat("device state ", 1000))
	write("vmm/config.json", `{"cpus":1}`)
	write("vmm/empty", "")
	f, err := os.Create(filepath.Join(dir, "vmm", "memory"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(10 * ExtentSize); err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 10; i += 3 {
		if _, err := f.WriteAt([]byte("page of extent "+string(rune('0'+i))), i*ExtentSize+4096); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func seal(t *testing.T, dir string) Manifest {
	t.Helper()
	man, err := SealSmall(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Large) != 1 || man.Large["vmm/memory"] != 10*ExtentSize {
		t.Fatalf("large files: %v", man.Large)
	}
	if Sealed(dir) {
		t.Fatal("sealed before Seal")
	}
	if err := Seal(context.Background(), dir, Pace{}, "", nil); err != nil {
		t.Fatal(err)
	}
	if !Sealed(dir) {
		t.Fatal("not sealed after Seal")
	}
	return man
}

func corrupt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{0xde, 0xad}, off); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyFindsEachDamage(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, file string
		off        int64
		want       string
	}{
		{"device state", "vmm/state", 100, "vmm/state extent 0 (offset 0 MiB) does not match its digest"},
		{"config", "vmm/config.json", 2, "vmm/config.json extent 0"},
		{"memory extent", "vmm/memory", 7*ExtentSize + 12345, "vmm/memory extent 7 (offset 28 MiB) does not match its digest"},
		{"memory hole", "vmm/memory", 5 * ExtentSize, "vmm/memory extent 5 (offset 20 MiB)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := snapshotDir(t)
			seal(t, dir)
			if res, err := Verify(ctx, dir, Policy{Full: true}); err != nil || len(res) != 4 {
				t.Fatalf("intact: %v %+v", err, res)
			}
			corrupt(t, filepath.Join(dir, tc.file), tc.off)
			res, err := Verify(ctx, dir, Policy{Full: true})
			var de *DamageError
			if !errors.As(err, &de) || !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			bad := 0
			for _, r := range res {
				if r.Status != "ok" {
					bad++
					if r.File != tc.file || r.Status != "damaged" {
						t.Errorf("result %+v", r)
					}
				}
			}
			if bad != 1 || len(res) != 4 {
				t.Errorf("results %+v", res)
			}
		})
	}
}

func TestVerifyPolicies(t *testing.T) {
	ctx := context.Background()
	dir := snapshotDir(t)
	seal(t, dir)
	// Sampling always reads the first and the last extent, and the
	// small files whole.
	corrupt(t, filepath.Join(dir, "vmm", "memory"), 9*ExtentSize+1)
	if _, err := Verify(ctx, dir, Policy{Sample: 0}); !errors.Is(err, ErrDamaged) {
		t.Fatalf("last extent not read by a sample: %v", err)
	}
	dir = snapshotDir(t)
	seal(t, dir)
	corrupt(t, filepath.Join(dir, "vmm", "memory"), 4*ExtentSize+1)
	res, err := Verify(ctx, dir, Policy{Sample: 0})
	if err != nil {
		t.Fatalf("a sample of first and last read the middle: %v", err)
	}
	for _, r := range res {
		if r.File == "vmm/memory" && (r.Extents != 2 || r.Of != 10) {
			t.Errorf("sampled %+v", r)
		}
	}
	if _, err := Verify(ctx, dir, Policy{Whole: []string{"vmm/"}}); !errors.Is(err, ErrDamaged) {
		t.Fatalf("whole vmm/ missed the middle: %v", err)
	}
	// A missing file and a file of another size are damage too.
	dir = snapshotDir(t)
	seal(t, dir)
	os.Remove(filepath.Join(dir, "vmm", "config.json"))
	os.Truncate(filepath.Join(dir, "vmm", "memory"), ExtentSize)
	res, err = Verify(ctx, dir, Policy{})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "vmm/config.json is missing") {
		t.Fatalf("missing file: %v", err)
	}
	for _, r := range res {
		if (r.File == "vmm/config.json" || r.File == "vmm/memory") && r.Status != "missing" {
			t.Errorf("%+v", r)
		}
	}
}

func TestSealIsTiedToItsManifest(t *testing.T) {
	ctx := context.Background()
	dir := snapshotDir(t)
	if _, err := Verify(ctx, dir, Policy{}); !errors.Is(err, ErrUnsealed) {
		t.Fatalf("no manifest: %v", err)
	}
	old, err := SealSmall(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	// Before Seal, the memory is listed as unsealed, not damaged.
	res, err := Verify(ctx, dir, Policy{Full: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.File == "vmm/memory" && r.Status != "unsealed" {
			t.Errorf("%+v", r)
		}
	}
	// A new snapshot in the same place: the late sealer of the old one
	// must not vouch for it.
	if _, err := SealSmall(ctx, dir); err != nil {
		t.Fatal(err)
	}
	data := `{"vmm/memory":{"size":41943040,"extents":["0","0","0","0","0","0","0","0","0","0"]}}`
	if err := os.WriteFile(filepath.Join(dir, largeManifest(old.Seal)), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if Sealed(dir) {
		t.Fatal("the old seal's digests were taken for the new snapshot")
	}
	if err := Seal(ctx, dir, Pace{}, "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ctx, dir, Policy{Full: true}); err != nil {
		t.Fatal(err)
	}
}

func TestSealSmallTakesOverASealedSubdirectory(t *testing.T) {
	ctx := context.Background()
	// A suspend slot, sealed, cloned as a checkpoint's vmm/ directory.
	slot := snapshotDir(t)
	vmmDir := filepath.Join(slot, "vmm")
	if _, err := SealSmall(ctx, vmmDir); err != nil {
		t.Fatal(err)
	}
	if err := Seal(ctx, vmmDir, Pace{}, "", nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(slot, DiskFile), []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	man, err := SealSmall(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Large) != 0 || len(man.Files["vmm/memory"].Extents) != 10 {
		t.Fatalf("memory digests not taken over: large %v", man.Large)
	}
	if _, err := Verify(ctx, slot, Policy{Full: true}); err != nil {
		t.Fatal(err)
	}
}

// TestRecordedSealMakesLostDigestsDamage: a snapshot recorded with a seal
// (in the registry) is damaged without its digests, or with another
// snapshot's; its large files' digests may be missing only while they are
// being written.
func TestRecordedSealMakesLostDigestsDamage(t *testing.T) {
	ctx := context.Background()
	dir := snapshotDir(t)
	man := seal(t, dir)
	corrupt(t, filepath.Join(dir, "vmm", "memory"), 3*ExtentSize)
	os.Remove(filepath.Join(dir, largeManifest(man.Seal)))
	if _, err := Verify(ctx, dir, Policy{Full: true, Seal: man.Seal}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "vmm/memory has no digests") {
		t.Fatalf("large digests lost: %v", err)
	}
	if res, err := Verify(ctx, dir, Policy{Full: true, Seal: man.Seal, Sealing: true}); err != nil || res[len(res)-1].Status != "unsealed" {
		t.Fatalf("large digests being written: %v %+v", err, res)
	}
	if _, err := Verify(ctx, dir, Policy{Full: true, Seal: "0123"}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "belongs to another snapshot") {
		t.Fatalf("another seal: %v", err)
	}
	os.Remove(filepath.Join(dir, ManifestFile))
	if _, err := Verify(ctx, dir, Policy{Full: true, Seal: man.Seal}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "digests.json is missing") {
		t.Fatalf("manifest lost: %v", err)
	}
	if _, err := Verify(ctx, dir, Policy{Full: true}); !errors.Is(err, ErrUnsealed) {
		t.Fatalf("no seal recorded, no manifest: %v", err)
	}
}

// TestDataOnlyReadsWhatHeldData: a whole read with DataOnly reads the
// extents that held data when sealed, the first and the last, and a
// sample of the zero ones; damage in a data extent is always found.
func TestDataOnlyReadsWhatHeldData(t *testing.T) {
	ctx := context.Background()
	dir := snapshotDir(t) // data in extents 0, 3, 6, 9 of 10
	seal(t, dir)
	p := Policy{Whole: []string{""}, DataOnly: true, Sample: 1}
	res, err := Verify(ctx, dir, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.File == "vmm/memory" && r.Extents != 4+3 {
			t.Errorf("read %d extents, want the 4 with data and 3 of the zero ones: %+v", r.Extents, r)
		}
	}
	corrupt(t, filepath.Join(dir, "vmm", "memory"), 6*ExtentSize+100)
	if _, err := Verify(ctx, dir, p); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "extent 6") {
		t.Fatalf("damage in a data extent: %v", err)
	}
}

// TestSealReadsLocalCopies: a local copy of the memory is digested in
// place of the snapshot's file (so a difference between them is damage
// of the snapshot's file), and one of another size, or gone, is not used.
func TestSealReadsLocalCopies(t *testing.T) {
	ctx := context.Background()
	dir := snapshotDir(t)
	mem := filepath.Join(dir, "vmm", "memory")
	local := filepath.Join(t.TempDir(), "copy")
	data, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
	corrupt(t, mem, 3*ExtentSize+10) // the volume's file went bad as it was written
	man, err := SealSmall(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	// A copy of another snapshot (an older sleep's, of the same size) is
	// not read for this one.
	if err := Seal(ctx, dir, Pace{}, "an older seal", map[string]string{"vmm/memory": local}); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ctx, dir, Policy{Full: true, Local: map[string]string{"vmm/memory": local}}); err == nil {
		t.Fatal("digests of the volume's damaged file were made from a local copy of another seal's snapshot")
	}
	if man, err = SealSmall(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if err := Seal(ctx, dir, Pace{}, man.Seal, map[string]string{"vmm/memory": local}); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ctx, dir, Policy{Full: true, Local: map[string]string{"vmm/memory": local}}); err != nil {
		t.Fatalf("the local copy against digests made from it: %v", err)
	}
	var dmg *DamageError
	if _, err := Verify(ctx, dir, Policy{Full: true}); !errors.As(err, &dmg) || dmg.File != "vmm/memory" || dmg.Extent != 3 {
		t.Fatalf("the volume's damaged file against the copy's digests: got %v, want damage in extent 3", err)
	}

	// A copy of another size, or a missing one: the snapshot's own file.
	for _, bad := range []string{filepath.Join(t.TempDir(), "missing"), filepath.Join(dir, "vmm", "state")} {
		man, err := SealSmall(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := Seal(ctx, dir, Pace{}, man.Seal, map[string]string{"vmm/memory": bad}); err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(ctx, dir, Policy{Full: true}); err != nil {
			t.Fatalf("local copy %s not usable: the snapshot's file should have been read: %v", bad, err)
		}
	}
}

// TestHolesNotRead: with the filesystem's map of a file's data, a seal
// and a full verification read only the extents that hold data. The
// digests are those of a seal that reads everything. A seal takes a
// steady map at its word, and reads whole when the map changed under it;
// a verification reads what the digests say is data whatever the map
// says; damage in data is still found.
func TestHolesNotRead(t *testing.T) {
	ctx := context.Background()
	dir := snapshotDir(t) // data in extents 0, 3, 6, 9 of 10
	mem := filepath.Join(dir, "vmm", "memory")
	seekData := func(path string) ([]sparse.Extent, bool) {
		ext, ok, err := sparse.DataRanges(path)
		return ext, ok && err == nil
	}
	if ext, ok := seekData(mem); !ok || len(ext) != 4 {
		t.Skipf("the test dir's filesystem does not tell holes (SEEK_DATA): %v", ext)
	}
	man, err := SealSmall(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := Seal(ctx, dir, Pace{Data: seekData}, "", nil); err != nil {
		t.Fatal(err)
	}
	mapped, err := readLarge(dir, man.Seal)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := digestFile(ctx, mem, Pace{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(mapped["vmm/memory"].Extents, whole.Extents) {
		t.Fatalf("digests with holes skipped differ from a whole read:\n%v\n%v", mapped["vmm/memory"].Extents, whole.Extents)
	}

	p := Policy{Full: true, Seal: man.Seal, Data: seekData}
	res, err := Verify(ctx, dir, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.File == "vmm/memory" && (r.Extents != 10 || r.Holes != 6 || r.ReadBytes != 4*ExtentSize) {
			t.Errorf("checked %d extents, %d of them holes, read %d bytes; want 10, 6, %d", r.Extents, r.Holes, r.ReadBytes, 4*ExtentSize)
		}
	}

	// A map that calls everything a hole. Verify reads what the
	// digests say is data all the same (no false damage, no damage
	// missed).
	allHoles := func(string) ([]sparse.Extent, bool) { return nil, true }
	res, err = Verify(ctx, dir, Policy{Full: true, Seal: man.Seal, Data: allHoles})
	if err != nil {
		t.Fatalf("data mapped as holes: %v", err)
	}
	for _, r := range res {
		if r.File == "vmm/memory" && (r.Holes != 6 || r.ReadBytes != 4*ExtentSize) {
			t.Errorf("data mapped as holes: %d holes, read %d bytes; want 6, %d", r.Holes, r.ReadBytes, 4*ExtentSize)
		}
	}
	// A seal takes the map at its word: nothing is read ...
	fd, err := digestFile(ctx, mem, Pace{Data: allHoles})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range fd.Extents {
		if d != zeroDigest(ExtentSize) {
			t.Fatalf("extent %d of a file mapped as holes: digest %s, not that of zeros", i, d)
		}
	}
	// ... unless the map says data there when asked again (a map that
	// missed data): those extents are read.
	var asked int
	flaky := func(path string) ([]sparse.Extent, bool) {
		if asked++; asked == 1 {
			return nil, true
		}
		return seekData(path)
	}
	if fd, err = digestFile(ctx, mem, Pace{Data: flaky}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fd.Extents, whole.Extents) {
		t.Errorf("a map that missed data: digests differ from a whole read")
	}
	// Holes that became data (JuiceFS's compaction fills the gaps
	// between slices with zeros): read again, they are zeros still.
	asked = 0
	filled := func(path string) ([]sparse.Extent, bool) {
		if asked++; asked == 1 {
			return seekData(path)
		}
		return []sparse.Extent{{Off: 0, Len: 10 * ExtentSize}}, true
	}
	if fd, err = digestFile(ctx, mem, Pace{Data: filled}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fd.Extents, whole.Extents) {
		t.Errorf("holes filled meanwhile: digests differ from a whole read")
	}

	corrupt(t, mem, 6*ExtentSize+100)
	if _, err := Verify(ctx, dir, p); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "extent 6") {
		t.Fatalf("damage in a data extent: %v", err)
	}
}
