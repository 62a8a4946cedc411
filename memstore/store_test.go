package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ram makes a sparse file of size bytes with data at the given extents
// (random bytes), as a guest's RAM file would be.
func ram(t *testing.T, path string, size int64, data ...int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, i := range data {
		overwrite(t, path, i)
	}
}

// overwrite puts new random bytes into extent i of the file at path.
func overwrite(t *testing.T, path string, i int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, ExtentSize)
	rand.Read(b)
	if _, err := f.WriteAt(b, i*ExtentSize); err != nil {
		t.Fatal(err)
	}
}

// pattern writes one pattern ("den\n" repeated) into extents idx of the
// file at path, as a guest's buffers of one pattern would be.
func pattern(t *testing.T, path string, idx ...int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	same := bytes.Repeat([]byte("den\n"), ExtentSize/4)
	for _, i := range idx {
		if _, err := f.WriteAt(same, i*ExtentSize); err != nil {
			t.Fatal(err)
		}
	}
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Fatalf("%s and %s differ", a, b)
	}
}

func snapDir(t *testing.T, root, name string) string {
	d := filepath.Join(root, name)
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSaveSharesWithItsOrigin(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, err := Open(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(root, "ram")
	ram(t, src, 64*ExtentSize, 0, 1, 2, 10, 11, 40, 63)
	a := snapDir(t, root, "a")
	m1, st, err := s.Save(ctx, src, a, SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Extents != 7 || st.Reused != 0 || st.Written != 7*ExtentSize || st.Pack == "" || len(m1.Extents) != 7 {
		t.Fatalf("first save: %+v", st)
	}
	copyA := filepath.Join(root, "copy-a") // a local copy of a's memory
	if data, err := os.ReadFile(src); err != nil || os.WriteFile(copyA, data, 0o600) != nil {
		t.Fatal(err)
	}
	overwrite(t, src, 10)
	overwrite(t, src, 20) // a hole before
	b := snapDir(t, root, "b")
	m2, st, err := s.Save(ctx, src, b, SaveOptions{Origin: a})
	if err != nil {
		t.Fatal(err)
	}
	if st.Extents != 8 || st.Reused != 6 || st.Written != 2*ExtentSize || len(m2.Extents) != 8 {
		t.Fatalf("second save: %+v", st)
	}
	// With the origin's local copy, the unchanged extents are compared,
	// not hashed: the same manifest.
	b2 := snapDir(t, root, "b2")
	m2c, st, err := s.Save(ctx, src, b2, SaveOptions{Origin: a, OriginCopy: copyA})
	if err != nil || st.Reused != 6 || !slices.Equal(m2c.Extents, m2.Extents) {
		t.Fatalf("save with the origin's copy: %+v %v", st, err)
	}
	// Each restores exactly, the first after the second was saved.
	for _, c := range []struct{ dir, want string }{{b, src}} {
		m, err := ReadManifest(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(root, "out")
		if err := s.Fill(ctx, m, out); err != nil {
			t.Fatal(err)
		}
		sameFile(t, out, c.want)
	}
	// An origin whose manifest is gone shares nothing.
	c := snapDir(t, root, "c")
	if _, st, err = s.Save(ctx, src, c, SaveOptions{Origin: filepath.Join(root, "gone")}); err != nil || st.Reused != 0 {
		t.Fatalf("save with a gone origin: %+v %v", st, err)
	}
}

func TestCollectKeepsWhatIsNamed(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	snaps := filepath.Join(root, "snaps")
	src := filepath.Join(root, "ram")
	ram(t, src, 32*ExtentSize, 0, 1, 2, 3)
	var dirs []string
	for i := range 4 {
		d := snapDir(t, snaps, string(rune('a'+i)))
		origin := ""
		if i > 0 {
			origin = dirs[i-1]
		}
		if _, _, err := s.Save(ctx, src, d, SaveOptions{Origin: origin}); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
		overwrite(t, src, int64(i))
	}
	want := map[string][]byte{}
	for _, d := range dirs {
		m, _ := ReadManifest(d)
		out := filepath.Join(root, "out-"+filepath.Base(d))
		if err := s.Fill(ctx, m, out); err != nil {
			t.Fatal(err)
		}
		want[d], _ = os.ReadFile(out)
	}
	// Drop every other snapshot: the rest still fill the same. Each
	// snapshot's pack holds the one extent changed since the last; only
	// d's pack is named by no snapshot left.
	os.RemoveAll(dirs[1])
	os.RemoveAll(dirs[3])
	dry, err := s.Collect(ctx, []string{snaps}, CollectOptions{DryRun: true, Grace: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Packs != 4 || len(dry.Garbage) != 1 || dry.Removed != 0 {
		t.Fatalf("dry run: %+v", dry)
	}
	young, err := s.Collect(ctx, []string{snaps}, CollectOptions{Grace: time.Hour})
	if err != nil || young.Removed != 0 || young.Young != 4 {
		t.Fatalf("within the grace period: %+v %v", young, err)
	}
	got, err := s.Collect(ctx, []string{snaps}, CollectOptions{Grace: time.Nanosecond})
	if err != nil || got.Removed != 1 {
		t.Fatalf("collect: %+v %v", got, err)
	}
	for _, d := range []string{dirs[0], dirs[2]} {
		m, _ := ReadManifest(d)
		out := filepath.Join(root, "again")
		os.Remove(out)
		if err := s.Fill(ctx, m, out); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(out); !bytes.Equal(b, want[d]) {
			t.Fatalf("%s changed after the collection", d)
		}
	}
	u, err := s.Usage(ctx, map[string][]string{"a": {filepath.Join(dirs[0], ManifestFile)}, "c": {filepath.Join(dirs[2], ManifestFile)}})
	if err != nil {
		t.Fatal(err)
	}
	// c changed extents 0 and 1 of a, and shares 2 and 3.
	if u.Groups["a"].Unique != 2*ExtentSize || u.Groups["a"].Shared != 2*ExtentSize || u.Groups["c"].Unique != 2*ExtentSize ||
		u.Live != 6*ExtentSize || u.Stored != u.Live || u.Packs != 3 {
		t.Fatalf("usage: %+v", u)
	}
}

func TestDamageIsFoundInEverySnapshotThatSharesIt(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	src := filepath.Join(root, "ram")
	ram(t, src, 16*ExtentSize, 0, 5, 9)
	a, b := snapDir(t, root, "a"), snapDir(t, root, "b")
	ma, _, err := s.Save(ctx, src, a, SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	overwrite(t, src, 9)
	mb, _, err := s.Save(ctx, src, b, SaveOptions{Origin: a})
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte of extent 5, which both name.
	name, at, ok := s.Locate(ma.Extents[1].Digest)
	if !ok || ma.Extents[1].Index != 5 {
		t.Fatalf("extent 5 is nowhere: %v", ma.Extents)
	}
	pack := s.packPath(name)
	f, _ := os.OpenFile(pack, os.O_RDWR, 0)
	one := []byte{0}
	f.ReadAt(one, at+7)
	one[0] ^= 1
	f.WriteAt(one, at+7)
	f.Close()
	for _, m := range []*Manifest{ma, mb} {
		bad, err := s.Verify(ctx, m)
		if err != nil || len(bad) != 1 || bad[0].Off != 5*ExtentSize {
			t.Fatalf("verify: %v %v", bad, err)
		}
		if err := s.Fill(ctx, m, filepath.Join(root, "out")); !errors.Is(err, ErrDamaged) {
			t.Fatalf("fill of a damaged snapshot: %v", err)
		}
	}
	os.Remove(pack)
	os.Remove(pack + idxSuffix)
	if bad, _ := s.Verify(ctx, mb); len(bad) != 2 {
		t.Fatalf("verify with a pack gone: %v", bad)
	}
}

// TestCollectRacingSaves: collections with no grace at all, racing four
// writers whose snapshots share extents, never remove a named pack.
func TestCollectRacingSaves(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	snaps := filepath.Join(root, "snaps")
	base := filepath.Join(root, "base")
	ram(t, base, 32*ExtentSize, 0, 1, 2, 3, 4, 5, 6, 7)
	bdir := snapDir(t, snaps, "base")
	if _, _, err := s.Save(ctx, base, bdir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var gc sync.WaitGroup
	gc.Add(1)
	go func() {
		defer gc.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// A listing that raced a removal stops without removing.
			if _, err := s.Collect(ctx, []string{snaps}, CollectOptions{Grace: time.Nanosecond}); err != nil && !errors.Is(err, ErrChanged) {
				t.Error(err)
				return
			}
		}
	}()
	var w sync.WaitGroup
	for v := range 4 {
		w.Add(1)
		go func() {
			defer w.Done()
			src := filepath.Join(root, "ram"+string(rune('a'+v)))
			b, _ := os.ReadFile(base)
			os.WriteFile(src, b, 0o600)
			origin := bdir
			for i := range 10 {
				overwrite(t, src, int64(i%8))
				d := snapDir(t, snaps, filepath.Join(string(rune('a'+v)), string(rune('0'+i))))
				if _, _, err := s.Save(ctx, src, d, SaveOptions{Origin: origin}); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 1 {
					os.RemoveAll(origin) // the older one goes: only d names its extents now
				}
				origin = d
			}
		}()
	}
	w.Wait()
	close(stop)
	gc.Wait()
	paths, _ := FindManifests(snaps)
	for _, p := range paths {
		m, err := ReadManifest(filepath.Dir(p))
		if err != nil {
			t.Fatal(err)
		}
		if bad, err := s.Verify(ctx, m); err != nil || len(bad) > 0 {
			t.Fatalf("%s after the race: %v %v", p, bad, err)
		}
	}
}

// TestRepack: packs mostly dead have their live extents moved into a new
// pack and go; every snapshot left fills as before, and the store holds
// about what they name.
func TestRepack(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	snaps := filepath.Join(root, "snaps")
	src := filepath.Join(root, "ram")
	all := make([]int64, 64)
	for i := range all {
		all[i] = int64(i)
	}
	ram(t, src, 64*ExtentSize, all...) // a first pack of 64 extents
	first := snapDir(t, snaps, "first")
	if _, _, err := s.Save(ctx, src, first, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	// The guest changes 60 of them: the first pack is mostly dead once
	// the first snapshot goes.
	for i := range int64(60) {
		overwrite(t, src, i)
	}
	second := snapDir(t, snaps, "second")
	if _, _, err := s.Save(ctx, src, second, SaveOptions{Origin: first}); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	os.RemoveAll(first)
	m, _ := ReadManifest(second)
	out := filepath.Join(root, "out")
	if err := s.Fill(ctx, m, out); err != nil { // s reads the indexes now
		t.Fatal(err)
	}
	before, _ := s.Usage(ctx, map[string][]string{"second": {filepath.Join(second, ManifestFile)}})
	got, err := s.Collect(ctx, []string{snaps}, CollectOptions{Grace: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Repacked) != 1 || got.Moved != 4*ExtentSize || got.Removed != 1 {
		t.Fatalf("collect: %+v", got)
	}
	after, _ := s.Usage(ctx, map[string][]string{"second": {filepath.Join(second, ManifestFile)}})
	if after.Stored != after.Live || after.Stored >= before.Stored || after.Live != 64*ExtentSize {
		t.Fatalf("usage before %+v, after %+v", before, after)
	}
	// A store whose index was read before the move finds the extents
	// where they went.
	os.Remove(out)
	if err := s.Fill(ctx, m, out); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, want) {
		t.Fatal("the second snapshot changed after the repack")
	}
	other, _ := Open(filepath.Join(root, "store"))
	os.Remove(out)
	if err := other.Fill(ctx, m, out); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedCopyWrittenAgain: once a copy of an extent is found
// damaged, the next snapshot writes the extent again from the RAM, a
// restore reads that copy, and the collection keeps it.
func TestDamagedCopyWrittenAgain(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	snaps := filepath.Join(root, "snaps")
	src := filepath.Join(root, "ram")
	ram(t, src, 8*ExtentSize, 1, 2, 3)
	a := snapDir(t, snaps, "a")
	ma, _, err := s.Save(ctx, src, a, SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name, at, _ := s.Locate(ma.Extents[0].Digest)
	f, _ := os.OpenFile(s.packPath(name), os.O_RDWR, 0)
	f.WriteAt([]byte{0xff, 0xee}, at+10)
	f.Close()
	if bad, err := s.Verify(ctx, ma); err != nil || len(bad) != 1 {
		t.Fatalf("verify: %v %v", bad, err)
	}
	b := snapDir(t, snaps, "b")
	mb, st, err := s.Save(ctx, src, b, SaveOptions{Origin: a})
	if err != nil || st.Reused != 2 || st.Written != ExtentSize {
		t.Fatalf("the snapshot after the damage: %+v %v", st, err)
	}
	out := filepath.Join(root, "out")
	if err := s.Fill(ctx, mb, out); err != nil {
		t.Fatalf("fill past the damaged copy: %v", err)
	}
	want, _ := os.ReadFile(src)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("filled memory differs")
	}
	os.RemoveAll(a)
	if _, err := s.Collect(ctx, []string{snaps}, CollectOptions{Grace: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	other, _ := Open(filepath.Join(root, "store"))
	if bad, err := other.Verify(ctx, mb); err != nil || len(bad) != 0 {
		t.Fatalf("after the collection: %v %v", bad, err)
	}
}

// TestCopySums: a local copy checks against the sums it was made with,
// and not once a byte of it changed.
func TestCopySums(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	src := filepath.Join(root, "ram")
	ram(t, src, 200*ExtentSize, 0, 70, 130, 199)
	m, _, err := s.Save(ctx, src, snapDir(t, root, "a"), SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sums, err := SumCopy(ctx, src)
	if err != nil || !CheckCopy(ctx, m, src, sums) {
		t.Fatalf("a copy as it was made: %v", err)
	}
	f, _ := os.OpenFile(src, os.O_RDWR, 0)
	f.WriteAt([]byte{1}, 130*ExtentSize+5)
	f.Close()
	if CheckCopy(ctx, m, src, sums) {
		t.Fatal("a changed copy checked against its sums")
	}
	if err := VerifyCopy(ctx, m, src); !errors.Is(err, ErrDamaged) {
		t.Fatalf("verify of the changed copy: %v", err)
	}
}

// TestRepeatedPiecesReadOnce: a memory whose pieces repeat (a guest's
// buffers of one pattern) is stored with each piece once, read with each
// piece once, filled whole, and damage to the repeated piece is found at
// every place it is.
func TestRepeatedPiecesReadOnce(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	src := filepath.Join(root, "ram")
	ram(t, src, 16*ExtentSize, 1)
	pattern(t, src, 3, 4, 10, 15)
	m, st, err := s.Save(ctx, src, snapDir(t, root, "a"), SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Extents) != 5 || st.Written != 2*ExtentSize {
		t.Fatalf("saved %d extents, %d bytes written: want 5 extents, 2 pieces written", len(m.Extents), st.Written)
	}
	if first, _ := byDigest(m.Extents); len(first) != 2 {
		t.Fatalf("%d pieces to read, want 2", len(first))
	}
	out := filepath.Join(root, "out")
	if err := s.Fill(ctx, m, out); err != nil {
		t.Fatal(err)
	}
	sameFile(t, src, out)

	name, at, ok := s.Locate(m.Extents[1].Digest)
	if !ok || m.Extents[1].Index != 3 {
		t.Fatalf("the repeated piece is nowhere: %v", m.Extents)
	}
	p, _ := os.OpenFile(s.packPath(name), os.O_RDWR, 0)
	p.WriteAt([]byte("x"), at+1)
	p.Close()
	bad, err := s.Verify(ctx, m)
	var offs []int64
	for _, d := range bad {
		offs = append(offs, d.Off/ExtentSize)
	}
	slices.Sort(offs)
	if err != nil || !slices.Equal(offs, []int64{3, 4, 10, 15}) {
		t.Fatalf("verify: damage at pieces %v (%v), want 3 4 10 15", offs, err)
	}
}

// TestFillFromAnotherCopy: a memory sent from a local copy (SendCopy) of
// what a manifest names fills a RAM file whole, each repeated piece sent
// once; a stream with a changed byte, or cut short, fails the fill.
func TestFillFromAnotherCopy(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(filepath.Join(root, "store"))
	src := filepath.Join(root, "ram")
	ram(t, src, 16*ExtentSize, 1, 2, 7)
	pattern(t, src, 3, 9, 15)
	m, _, err := s.Save(ctx, src, snapDir(t, root, "a"), SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var idx []int64
	for _, e := range Wanted(m) {
		idx = append(idx, e.Index)
	}
	if len(idx) != 4 {
		t.Fatalf("wanted extents %v: want 4 (three of random bytes, one repeated)", idx)
	}
	var sent bytes.Buffer
	if err := SendCopy(ctx, src, 16*ExtentSize, idx, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Len() != 4*ExtentSize {
		t.Fatalf("sent %d bytes, want %d", sent.Len(), 4*ExtentSize)
	}
	out := filepath.Join(root, "out")
	if err := FillFrom(ctx, m, out, bytes.NewReader(sent.Bytes())); err != nil {
		t.Fatal(err)
	}
	sameFile(t, src, out)

	changed := bytes.Clone(sent.Bytes())
	changed[2*ExtentSize+9] ^= 1
	if err := FillFrom(ctx, m, filepath.Join(root, "changed"), bytes.NewReader(changed)); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("fill from a stream with a changed byte: %v", err)
	}
	if err := FillFrom(ctx, m, filepath.Join(root, "short"), bytes.NewReader(sent.Bytes()[:3*ExtentSize])); err == nil {
		t.Fatal("fill from a stream cut short: no error")
	}
	if err := SendCopy(ctx, src, 16*ExtentSize, []int64{16}, io.Discard); err == nil {
		t.Fatal("an extent outside the memory sent")
	}
}
