package fsdiff

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// mkfs makes an ext4 image of dir's tree.
func mkfs(t *testing.T, dir, img string) {
	t.Helper()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", dir, img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
}

func sh(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

func write(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("fsdiff mounts ext4 images on loop devices: run as root")
	}
	for _, tool := range []string{"mkfs.ext4", "losetup", "mount", "diff"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/deps-apt.sh installs it)", tool)
		}
	}
}

// images makes the "before" image from a tree and the "after" image as
// a copy of it changed through a read-write mount, as a guest changes
// its disk between two checkpoints: unchanged files keep their inodes.
func images(t *testing.T) (before, after string, big []byte) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	big = make([]byte, 4<<20)
	rand.Read(big)
	write(t, src+"/root/keep.txt", []byte("keep\n"), 0o644)
	write(t, src+"/root/mod.txt", []byte("one\ntwo\nthree\n"), 0o644)
	write(t, src+"/root/same.txt", []byte("aaaa"), 0o644)
	write(t, src+"/root/script.sh", []byte("#!/bin/sh\necho hi\n"), 0o644)
	write(t, src+"/root/gone.txt", []byte("bye\n"), 0o600)
	write(t, src+"/root/old-name", []byte("moving\n"), 0o644)
	write(t, src+"/root/owned", []byte("mine\n"), 0o644)
	write(t, src+"/root/small.bin", []byte{1, 0, 2}, 0o644)
	write(t, src+"/root/big.bin", big, 0o644)
	write(t, src+"/root/dir/a", []byte("a\n"), 0o644)
	write(t, src+"/root/big.txt", bytes.Repeat([]byte("text\n"), 300<<10), 0o644)
	write(t, src+"/root/dir/b", []byte("b\n"), 0o644)
	for i := 0; i < 200; i++ {
		write(t, filepath.Join(src, "etc/many", "f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String()), []byte("same\n"), 0o644)
	}
	before = filepath.Join(dir, "before.ext4")
	mkfs(t, src, before)
	after = filepath.Join(dir, "after.ext4")
	sh(t, "cp", "--sparse=always", before, after)

	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	sh(t, "mount", "-t", "ext4", "-o", "loop", after, mnt)
	mounted := true
	defer func() {
		if mounted {
			exec.Command("umount", mnt).Run()
		}
	}()
	r := mnt + "/root/"
	write(t, r+"new.txt", []byte("hello\n"), 0o640)
	write(t, r+"mod.txt", []byte("one\n2\nthree\nfour\n"), 0o644)
	write(t, r+"same.txt", []byte("bbbb"), 0o644)
	must(t, os.Chmod(r+"script.sh", 0o755))
	must(t, os.Remove(r+"gone.txt"))
	must(t, os.Rename(r+"old-name", r+"new-name"))
	must(t, os.Chown(r+"owned", 1000, 1000))
	must(t, os.Symlink("mod.txt", r+"link"))
	must(t, os.Link(r+"keep.txt", r+"hard"))
	write(t, r+"small.bin", []byte{1, 0, 3}, 0o644)
	write(t, r+"big.txt", bytes.Repeat([]byte("text\n"), 301<<10), 0o644)
	f, err := os.OpenFile(r+"big.bin", os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.Write([]byte("appended\n"))
	must(t, err)
	must(t, f.Close())
	must(t, os.RemoveAll(r+"dir"))
	write(t, r+"dir", []byte("now a file\n"), 0o644)
	sh(t, "umount", mnt)
	mounted = false
	return before, after, big
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// summary is a change as the test expects it.
func summary(c Change) string {
	s := c.Op + " " + c.Path
	if len(c.What) > 0 {
		s += " " + strings.Join(c.What, ",")
	}
	if c.LinkOf != "" {
		s += " link-of " + c.LinkOf
	}
	if c.MovedFrom != "" {
		s += " moved-from " + c.MovedFrom
	}
	return s
}

func TestImages(t *testing.T) {
	needRoot(t)
	before, after, big := images(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	res, err := Images(ctx, before, after, Options{Patch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("diff of two 64 MiB images: %v", time.Since(start))
	var got []string
	byPath := map[string]Change{}
	for _, c := range res.Changes {
		got = append(got, summary(c))
		byPath[c.Path] = c
	}
	want := []string{
		"changed /root/big.bin content",
		"changed /root/big.txt content",
		"changed /root/dir type",
		"removed /root/dir/a",
		"removed /root/dir/b",
		"removed /root/gone.txt",
		"added /root/hard link-of /root/keep.txt",
		"added /root/link",
		"changed /root/mod.txt content",
		"added /root/new-name moved-from /root/old-name",
		"added /root/new.txt",
		"removed /root/old-name",
		"changed /root/owned owner",
		"changed /root/same.txt content",
		"changed /root/script.sh mode",
		"changed /root/small.bin content",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantSum := Summary{Added: 4, Removed: 4, Changed: 8,
		AddedBytes: 6 + 5 + 7, RemovedBytes: 2 + 2 + 4 + 7, ChangedBytes: 9 + 3 + 11 + 5<<10}
	if res.Summary != wantSum {
		t.Errorf("summary %+v, want %+v", res.Summary, wantSum)
	}
	if c := byPath["/root/link"]; c.New.Type != TypeSymlink || c.New.Target != "mod.txt" {
		t.Errorf("symlink: %+v", c.New)
	}
	if c := byPath["/root/script.sh"]; c.Old.Mode != "0644" || c.New.Mode != "0755" {
		t.Errorf("chmod: %s -> %s", c.Old.Mode, c.New.Mode)
	}
	if c := byPath["/root/owned"]; c.New.UID != 1000 || c.New.GID != 1000 || c.Old.UID != 0 {
		t.Errorf("chown: %+v -> %+v", c.Old, c.New)
	}
	if c := byPath["/root/dir"]; c.Old.Type != TypeDir || c.New.Type != TypeFile || c.Patch != "" {
		t.Errorf("dir replaced by a file: %+v -> %+v, patch %q", c.Old, c.New, c.Patch)
	}
	if c := byPath["/root/big.bin"]; c.New.Size != int64(len(big))+9 || c.Patch != "" || !c.Binary {
		t.Errorf("appended large binary file: %+v, patch %d bytes, binary %v", c.New, len(c.Patch), c.Binary)
	}
	if c := byPath["/root/big.txt"]; c.Patch != "" || c.NoPatch != "larger than 1024 KiB" {
		t.Errorf("a large text file: patch %d bytes, no patch %q", len(c.Patch), c.NoPatch)
	}
	if c := byPath["/root/small.bin"]; !c.Binary || c.Patch != "" {
		t.Errorf("binary file: binary %v, patch %q", c.Binary, c.Patch)
	}
	wantPatch := "--- a/root/mod.txt\n+++ b/root/mod.txt\n@@ -1,3 +1,4 @@\n one\n-two\n+2\n three\n+four\n"
	if c := byPath["/root/mod.txt"]; c.Patch != wantPatch {
		t.Errorf("patch:\n%s\nwant:\n%s", c.Patch, wantPatch)
	}
	if c := byPath["/root/new.txt"]; !strings.Contains(c.Patch, "--- /dev/null\n+++ b/root/new.txt\n") || !strings.Contains(c.Patch, "+hello\n") {
		t.Errorf("patch of an added file:\n%s", c.Patch)
	}
	if c := byPath["/root/gone.txt"]; !strings.Contains(c.Patch, "-bye\n") {
		t.Errorf("patch of a removed file:\n%s", c.Patch)
	}

	// A prefix limits the diff to a subtree.
	res, err = Images(ctx, before, after, Options{Prefix: "/root/dir"})
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, c := range res.Changes {
		got = append(got, summary(c))
	}
	want = []string{"changed /root/dir type", "removed /root/dir/a", "removed /root/dir/b"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("prefix /root/dir: %q, want %q", got, want)
	}
	// An image against itself: nothing, and every mount undone.
	res, err = Images(ctx, before, before, Options{})
	if err != nil || len(res.Changes) != 0 {
		t.Errorf("an image against itself: %v, %+v", err, res.Changes)
	}
	out, _ := exec.Command("losetup", "--associated", before).Output()
	if len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("loop devices left attached: %s", out)
	}
}

func TestImagesBadInput(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := Images(ctx, filepath.Join(dir, "none"), filepath.Join(dir, "none"), Options{}); err == nil {
		t.Error("a missing image: no error")
	}
	junk := filepath.Join(dir, "junk")
	write(t, junk, bytes.Repeat([]byte{7}, 1<<20), 0o644)
	if _, err := Images(ctx, junk, junk, Options{}); err == nil {
		t.Error("an image that is not ext4: no error")
	}
	if out, _ := exec.Command("losetup", "--associated", junk).Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("a failed mount left its loop device: %s", out)
	}
	if _, err := CleanPrefix("/../etc"); err == nil {
		t.Error("a prefix out of the root: no error")
	}
	if p, err := CleanPrefix("root//x/"); err != nil || p != "/root/x" {
		t.Errorf("CleanPrefix: %q %v", p, err)
	}
}

// TestSweep: mounts a process left behind (it ended mid-diff) are
// undone, loop devices included.
func TestSweep(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	write(t, src+"/a", []byte("a"), 0o644)
	img := filepath.Join(dir, "img")
	mkfs(t, src, img)
	tmp := filepath.Join(dir, "mnt")
	m, err := Mount(context.Background(), img, tmp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.Root, "a")); err != nil {
		t.Fatalf("the mounted image: %v", err)
	}
	if err := Sweep(tmp); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "*")); len(left) > 0 {
		t.Errorf("left after the sweep: %v", left)
	}
	if out, _ := exec.Command("losetup", "--associated", img).Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("loop device left attached: %s", out)
	}
}

// TestJournalReplay: an image copied while its filesystem was mounted
// (a memory checkpoint of a running guest) needs its journal replayed;
// that happens in a copy, and the image itself is not written.
func TestJournalReplay(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	write(t, src+"/root/keep.txt", []byte("keep\n"), 0o644)
	before := filepath.Join(dir, "before.ext4")
	mkfs(t, src, before)
	live := filepath.Join(dir, "live.ext4")
	sh(t, "cp", "--sparse=always", before, live)
	mnt := filepath.Join(dir, "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	sh(t, "mount", "-t", "ext4", "-o", "loop", live, mnt)
	write(t, mnt+"/root/new.txt", []byte("in the journal\n"), 0o644)
	sh(t, "sync")
	snap := filepath.Join(dir, "snap.ext4")
	sh(t, "cp", "--sparse=always", live, snap) // as a clone of a running guest's disk
	sh(t, "umount", mnt)
	if need, err := needsRecovery(snap); err != nil || !need {
		t.Fatalf("the copy of a mounted image: needs recovery %v, %v", need, err)
	}
	orig, err := os.ReadFile(snap)
	must(t, err)

	ctx := context.Background()
	if _, err := Images(ctx, before, snap, Options{}); err == nil || !strings.Contains(err.Error(), "journal") {
		t.Errorf("without a way to copy: %v, want refused", err)
	}
	copies := 0
	opts := Options{Copy: func(ctx context.Context, image string) (string, func(), error) {
		copies++
		cp := filepath.Join(dir, "copy.ext4")
		if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", image, cp).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("cp: %w: %s", err, out)
		}
		return cp, func() { os.Remove(cp) }, nil
	}}
	res, err := Images(ctx, before, snap, opts)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Changes {
		got = append(got, summary(c))
	}
	if want := []string{"added /root/new.txt"}; !reflect.DeepEqual(got, want) || copies != 1 {
		t.Errorf("changes %q (copies %d), want %q", got, copies, want)
	}
	after, err := os.ReadFile(snap)
	must(t, err)
	if !bytes.Equal(orig, after) {
		t.Error("the image was written")
	}
	if _, err := os.Stat(filepath.Join(dir, "copy.ext4")); !os.IsNotExist(err) {
		t.Errorf("the copy is left: %v", err)
	}
}

func runOut(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}
