package pathrestore

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pkg/sftp"

	"github.com/denhq/den/fsdiff"
)

// sftpClient serves this host's files over an in-process SFTP server,
// as a guest's agent serves its own.
func sftpClient(t *testing.T) *sftp.Client {
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	srv, err := sftp.NewServer(struct {
		io.Reader
		io.WriteCloser
	}{sr, sw})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	c, err := sftp.NewClientPipe(cr, cw)
	if err != nil {
		t.Fatal(err)
	}
	// Closing the pipes ends both sides (a client's Close waits for a
	// server that has no reason to stop).
	t.Cleanup(func() { cr.Close(); sr.Close(); cw.Close(); sw.Close() })
	return c
}

func put(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// TestApply: a "guest" directory that drifted from its "checkpoint"
// every way a diff sees is put back, until a diff finds nothing; a file
// outside the path hard-linked to one inside keeps its content.
func TestApply(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown needs root")
	}
	ctx := context.Background()
	ckpt, guest := t.TempDir(), t.TempDir()
	proj := filepath.Join(guest, "project")
	// A path in the checkpoint (its root + the guest path) or the guest.
	in := func(root, rel string) string {
		if root == guest {
			return filepath.Join(proj, rel)
		}
		return filepath.Join(root, proj, rel)
	}
	// The checkpoint's side.
	put(t, in(ckpt, "kept.txt"), "same\n", 0o644)
	put(t, in(ckpt, "edited.txt"), "before\n", 0o644)
	put(t, in(ckpt, "deleted.txt"), "gone now\n", 0o600)
	put(t, in(ckpt, "gone/deep/file"), "deep\n", 0o644)
	put(t, in(ckpt, "chmoded.sh"), "#!/bin/sh\n", 0o755)
	put(t, in(ckpt, "was-file"), "a file\n", 0o644)
	put(t, in(ckpt, "linked.txt"), "mine\n", 0o644)
	if err := os.Symlink("kept.txt", in(ckpt, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(in(ckpt, "deleted.txt"), 1234, 5678); err != nil {
		t.Fatal(err)
	}
	// The guest's side now.
	put(t, in(guest, "kept.txt"), "same\n", 0o644)
	put(t, in(guest, "edited.txt"), "after, longer\n", 0o644)
	put(t, in(guest, "new.txt"), "new\n", 0o644)
	put(t, in(guest, "newdir/sub/x"), "x\n", 0o644)
	put(t, in(guest, "chmoded.sh"), "#!/bin/sh\n", 0o600)
	put(t, in(guest, "was-file/inside"), "now a dir\n", 0o644)
	put(t, filepath.Join(guest, "outside.txt"), "shared inode\n", 0o644)
	if err := os.Link(filepath.Join(guest, "outside.txt"), in(guest, "linked.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("edited.txt", in(guest, "link")); err != nil {
		t.Fatal(err)
	}
	// Same mtimes where the content is the same, as a real disk would have.
	for _, rel := range []string{"kept.txt", "chmoded.sh"} {
		fi, _ := os.Stat(in(ckpt, rel))
		os.Chtimes(in(guest, rel), fi.ModTime(), fi.ModTime())
	}

	diff := func() fsdiff.Result {
		t.Helper()
		res, err := fsdiff.Trees(ctx, ckpt, "/", fsdiff.Options{Prefix: proj})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	before := diff()
	if len(before.Changes) == 0 {
		t.Fatal("no changes to restore")
	}
	acts, err := Apply(ctx, sftpClient(t), ckpt, before.Changes)
	if err != nil {
		t.Fatalf("apply: %v (done: %+v)", err, acts)
	}
	if after := diff(); len(after.Changes) != 0 {
		t.Errorf("left after the restore: %+v\nactions: %+v", after.Changes, acts)
	}
	did := map[string]string{}
	for _, a := range acts {
		did[a.Path] += a.Did + " "
	}
	for rel, want := range map[string]string{
		"edited.txt": "rewritten ", "deleted.txt": "restored ", "new.txt": "removed ", "newdir": "removed ",
		"gone/deep/file": "restored ", "chmoded.sh": "chmod ", "was-file": "restored ", "link": "relinked ", "linked.txt": "rewritten ",
	} {
		if got := did[filepath.Join(proj, rel)]; got != want {
			t.Errorf("%s: did %q, want %q", rel, got, want)
		}
	}
	if _, ok := did[filepath.Join(proj, "kept.txt")]; ok {
		t.Error("an unchanged file was touched")
	}
	if b, _ := os.ReadFile(filepath.Join(guest, "outside.txt")); string(b) != "shared inode\n" {
		t.Errorf("the file outside the path, hard-linked to one inside, changed: %q", b)
	}
	if fi, err := os.Stat(in(guest, "deleted.txt")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("deleted.txt back: %v %v", fi, err)
	}
	entries, _ := os.ReadDir(proj)
	for _, e := range entries {
		if len(e.Name()) > len(tmpPrefix) && e.Name()[:len(tmpPrefix)] == tmpPrefix {
			t.Errorf("a temporary file is left: %s", e.Name())
		}
	}
}

func TestPrefixes(t *testing.T) {
	got := Prefixes([]string{"/a/b", "/a", "/c", "/a", "/ab", "/c/d/e"})
	if want := []string{"/a", "/ab", "/c"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestParents: a directory above the path that the guest lost is made
// again from the checkpoint; one that is now a symlink is refused.
func TestParents(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown needs root")
	}
	ckpt, guest := t.TempDir(), t.TempDir()
	put(t, filepath.Join(ckpt, guest, "gone", "deeper", "p", "f"), "x", 0o644)
	os.Chmod(filepath.Join(ckpt, guest, "gone"), 0o750)
	g := sftpClient(t)
	acts, err := Parents(g, ckpt, filepath.Join(guest, "gone", "deeper", "p"))
	if err != nil || len(acts) != 2 || acts[0].Path != filepath.Join(guest, "gone") || acts[1].Did != Restored {
		t.Fatalf("parents: %+v %v", acts, err)
	}
	if fi, err := os.Stat(filepath.Join(guest, "gone")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("made again: %v %v", fi, err)
	}
	if err := os.Symlink("/etc", filepath.Join(guest, "link")); err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(ckpt, guest, "link", "p", "f"), "x", 0o644)
	if _, err := Parents(g, ckpt, filepath.Join(guest, "link", "p")); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a symlink above the path: %v", err)
	}
}
