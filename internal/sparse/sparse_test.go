package sparse

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.Truncate(64 << 20)
	chunk := bytes.Repeat([]byte{0xab}, 1<<20)
	f.WriteAt(chunk, 10<<20)
	f.WriteAt(chunk, 50<<20)
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := Copy(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 8<<20 {
		t.Fatalf("copy of 2 MiB of data in a 64 MiB file uses %d bytes: holes were filled", used)
	}
}

func TestCopyIntoRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.Truncate(32 << 20)
	f.WriteAt(bytes.Repeat([]byte{1}, 3<<20), 4<<20)
	f.WriteAt([]byte("tail"), 32<<20-4)
	f.Close()
	mid := filepath.Join(dir, "mid")
	ext, err := CopyExtents(src, mid)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) != 2 {
		t.Fatalf("extents %v, want 2", ext)
	}
	back := filepath.Join(dir, "back")
	for _, e := range [][]Extent{ext, nil} { // the map, then SEEK_DATA
		if err := os.WriteFile(back, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(back, 32<<20); err != nil {
			t.Fatal(err)
		}
		if err := CopyInto(mid, back, e); err != nil {
			t.Fatal(err)
		}
		a, _ := os.ReadFile(src)
		b, _ := os.ReadFile(back)
		if !bytes.Equal(a, b) {
			t.Fatalf("round trip (extents %v) differs", e)
		}
	}
	if err := CopyInto(mid, back, []Extent{{Off: 31 << 20, Len: 2 << 20}}); err == nil {
		t.Fatal("an extent past the end was accepted")
	}
	if err := os.Truncate(back, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := CopyInto(mid, back, ext); err == nil {
		t.Fatal("a copy into a file of another size was accepted")
	}
}

// TestCopyIntoAcrossFilesystems copies a snapshot's memory as a wake
// does, from a disk into a tmpfs: copy_file_range refuses (EXDEV) and
// sendfile copies, at the extents' offsets, leaving the rest a hole.
func TestCopyIntoAcrossFilesystems(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "den-sparse-")
	if err != nil {
		t.Skipf("no /dev/shm to copy into: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	src := filepath.Join(t.TempDir(), "memory")
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	f, _ := os.Create(src)
	f.Truncate(16 << 20)
	f.WriteAt(data, 5<<20+4096)
	f.Close()
	dst := filepath.Join(shm, "memory")
	if err := os.WriteFile(dst, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(dst, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := CopyInto(src, dst, []Extent{{Off: 5<<20 + 4096, Len: 3 << 20}}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 4<<20 {
		t.Fatalf("a copy of 3 MiB of data uses %d bytes: holes were filled", used)
	}
}

func TestCopyDeltaWritesOnlyChangedPages(t *testing.T) {
	dir := t.TempDir()
	pattern := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = seed + byte(i*31+i>>12)
		}
		return b
	}
	sparse := func(name string, writes map[int64][]byte) string {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(16 << 20); err != nil {
			t.Fatal(err)
		}
		for off, b := range writes {
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	// base: data at 1-4 MiB and 8-9 MiB. src: one page changed in the
	// first, the second gone (a hole), two new pages at 12 MiB.
	first, second := pattern(3<<20, 1), pattern(1<<20, 2)
	base := sparse("base", map[int64][]byte{1 << 20: first, 8 << 20: second})
	changed := append([]byte(nil), first...)
	copy(changed[1<<20+pageSize:], pattern(pageSize, 9))
	copy(changed[1<<20+16*pageSize:], pattern(pageSize, 7)) // 56 KiB after the first: joined to it
	defer func(g int64) { DeltaGap = g }(DeltaGap)
	DeltaGap = 64 << 10
	src := sparse("src", map[int64][]byte{1 << 20: changed, 12 << 20: pattern(2*pageSize, 3)})
	dst := filepath.Join(dir, "dst")
	if err := Copy(base, dst); err != nil { // the clone of the earlier copy
		t.Fatal(err)
	}
	ext, written, err := CopyDelta(src, dst, base)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("dst does not hold what src holds")
	}
	if want := int64(16*pageSize + 1<<20 + 2*pageSize); written != want {
		t.Fatalf("wrote %d bytes, want %d (the changed pages, two of them joined)", written, want)
	}
	want, err := CopyExtents(src, filepath.Join(dir, "full"))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ext) != fmt.Sprint(want) {
		t.Fatalf("data ranges %v, want those of a full copy %v", ext, want)
	}
}

func TestCopyDeltaRefusesAnotherSize(t *testing.T) {
	dir := t.TempDir()
	src, dst, base := filepath.Join(dir, "src"), filepath.Join(dir, "dst"), filepath.Join(dir, "base")
	for p, size := range map[string]int64{src: 8 << 20, dst: 4 << 20, base: 4 << 20} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := CopyDelta(src, dst, base); err == nil {
		t.Fatal("a base of another size was taken")
	}
	if _, _, err := CopyDelta(src, dst, filepath.Join(dir, "none")); err == nil {
		t.Fatal("a missing base was taken")
	}
}
