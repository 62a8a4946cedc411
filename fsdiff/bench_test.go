package fsdiff

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkImages4G is issue 33's bounded-time case: two 4 GiB images
// holding a 1 GiB tree (16384 files of 64 KiB in 128 directories), 20
// files changed between them (10 rewritten at the same size, 5 appended
// to, 5 added). Each iteration starts with the images out of the host's
// page cache. Run it with
//
//	go test -run '^$' -bench Images4G -benchtime 3x ./fsdiff
func BenchmarkImages4G(b *testing.B) {
	if testing.Short() {
		b.Skip("makes two 4 GiB images")
	}
	if os.Geteuid() != 0 {
		b.Skip("mounts ext4 images: run as root")
	}
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	block := []byte(strings.Repeat("den diff bench line of text\n", 64<<10/28+1)[:64<<10])
	for d := 0; d < 128; d++ {
		sub := filepath.Join(src, "tree", fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := 0; f < 128; f++ {
			data := append([]byte(fmt.Sprintf("%d/%d\n", d, f)), block[8:]...)
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	before := filepath.Join(dir, "before.ext4")
	if out, err := runOut("mkfs.ext4", "-q", "-F", "-d", src, before, "4G"); err != nil {
		b.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	os.RemoveAll(src)
	after := filepath.Join(dir, "after.ext4")
	if out, err := runOut("cp", "--sparse=always", before, after); err != nil {
		b.Fatalf("cp: %v: %s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := runOut("mount", "-t", "ext4", "-o", "loop", after, mnt); err != nil {
		b.Fatalf("mount: %v: %s", err, out)
	}
	for i := 0; i < 20; i++ {
		p := filepath.Join(mnt, "tree", fmt.Sprintf("d%03d", i*6), fmt.Sprintf("f%03d", i))
		var err error
		switch {
		case i < 10:
			err = os.WriteFile(p, append([]byte("changed\n"), block[8:]...), 0o644)
		case i < 15:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0); err == nil {
				_, err = f.WriteString("appended\n")
				f.Close()
			}
		default:
			err = os.WriteFile(p+".new", []byte("new\n"), 0o644)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if out, err := runOut("umount", mnt); err != nil {
		b.Fatalf("umount: %v: %s", err, out)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for _, img := range []string{before, after} {
			uncache(b, img)
		}
		b.StartTimer()
		res, err := Images(ctx, before, after, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if s := res.Summary; s.Added != 5 || s.Changed != 15 || s.Removed != 0 {
			b.Fatalf("summary %+v, want 5 added, 15 changed", s)
		}
	}
}

// uncache drops a file's pages from the host's page cache.
func uncache(b *testing.B, p string) {
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
}
