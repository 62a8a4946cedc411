package image

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/identitytest"
	"github.com/denhq/den/internal/testutil"
)

// identityShell runs init-initramfs.sh's den_identity on root under the
// static busybox the initramfs holds, with only busybox's applets on PATH.
type identityShell struct {
	busybox string
	path    string
	script  string
}

func newIdentityShell(t *testing.T) *identityShell {
	t.Helper()
	var bb string
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			bb = p
			break
		}
	}
	if bb == "" {
		t.Skip("busybox not installed (apt-get install busybox-static)")
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	bin := t.TempDir()
	for _, a := range strings.Fields(string(out)) {
		if err := os.Symlink(bb, filepath.Join(bin, a)); err != nil {
			t.Fatal(err)
		}
	}
	src, err := os.ReadFile("init-initramfs.sh")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "# den-identity: begin", "# den-identity: end"
	s := string(src)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("init-initramfs.sh lacks the %q ... %q block", begin, end)
	}
	script := `log() { echo "den-initramfs: $*"; }` + "\n" + s[i:j] + "\nden_identity \"$@\"\n"
	return &identityShell{busybox: bb, path: bin, script: script}
}

// run runs den_identity ROOT TOKEN HOSTNAME and returns its output.
func (s *identityShell) run(t *testing.T, root, token, hostname string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.busybox, "sh", "-c", s.script, "sh", root, token, hostname)
	cmd.Env = []string{"PATH=" + s.path}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("den_identity %s %s: %v\n%s", token, hostname, err, out)
	}
	return string(out)
}

func writeTestFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestInitramfsIdentity(t *testing.T) {
	sh := newIdentityShell(t)
	root := identitytest.SourceRoot(t)
	etc := filepath.Join(root, "etc")

	// The recorded token: nothing changes, nothing is said.
	before := identitytest.Tree(t, root)
	if out := sh.run(t, root, identitytest.TokenA, "fork"); out != "" {
		t.Errorf("same token said %q", out)
	}
	if !maps.Equal(before, identitytest.Tree(t, root)) {
		t.Fatal("same token changed files")
	}

	out := sh.run(t, root, identitytest.TokenB, "fork")
	if out != "den-initramfs: new identity for fork\n" {
		t.Errorf("output %q", out)
	}
	identitytest.CheckNew(t, root, "fork", identitytest.TokenB)
	mid := identitytest.ReadTrimmed(t, filepath.Join(etc, "machine-id"))

	// Idempotent.
	before = identitytest.Tree(t, root)
	if out := sh.run(t, root, identitytest.TokenB, "other"); out != "" {
		t.Errorf("second run said %q", out)
	}
	if !maps.Equal(before, identitytest.Tree(t, root)) {
		t.Fatal("second run changed files")
	}

	// No den.hostname: the hostname stays, the machine-id changes.
	if out := sh.run(t, root, identitytest.TokenA, ""); out != "den-initramfs: new identity for fork\n" {
		t.Errorf("output %q", out)
	}
	if h := identitytest.ReadTrimmed(t, filepath.Join(etc, "hostname")); h != "fork" {
		t.Errorf("hostname %q", h)
	}
	if m := identitytest.ReadTrimmed(t, filepath.Join(etc, "machine-id")); m == mid || !identitytest.IsMachineID(m) {
		t.Errorf("machine-id %q (was %q)", m, mid)
	}
}

func TestInitramfsIdentityFreshAndBad(t *testing.T) {
	sh := newIdentityShell(t)
	// The minimal image: no machine-id, no etc/den/identity, no keys.
	root := t.TempDir()
	writeTestFile(t, filepath.Join(root, "etc/hostname"), "den\n")
	if err := os.MkdirAll(filepath.Join(root, "var/lib/dbus"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/machine-id", filepath.Join(root, "var/lib/dbus/machine-id")); err != nil {
		t.Fatal(err)
	}
	before := identitytest.Tree(t, root)
	for _, tok := range []string{"short", strings.ToUpper(identitytest.TokenA), identitytest.TokenA + "0", "$(touch x)"} {
		if out := sh.run(t, root, tok, "box"); !strings.Contains(out, "ignored") {
			t.Errorf("token %q: %q", tok, out)
		}
	}
	if !maps.Equal(before, identitytest.Tree(t, root)) {
		t.Fatal("a bad token changed files")
	}
	for i, h := range []string{"-x", "x-", "a..b", strings.Repeat("a", 65)} {
		tok := strings.Repeat(string("0123456789"[i]), 32)
		if out := sh.run(t, root, tok, h); !strings.Contains(out, "hostname kept") {
			t.Errorf("bad hostname %q: %q", h, out)
		}
	}
	if out := sh.run(t, root, identitytest.TokenA, "bad_host!"); !strings.Contains(out, "hostname kept") || !strings.Contains(out, "new identity for den") {
		t.Errorf("bad hostname: %q", out)
	}
	if identitytest.ReadTrimmed(t, filepath.Join(root, "etc/hostname")) != "den" || !identitytest.IsMachineID(identitytest.ReadTrimmed(t, filepath.Join(root, "etc/machine-id"))) {
		t.Error("hostname changed or no machine-id")
	}
	if st, err := os.Lstat(filepath.Join(root, "var/lib/dbus/machine-id")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("dbus machine-id link replaced (%v)", err)
	}

	// A step that fails: logged, the token is not recorded, the boot goes on.
	mid := filepath.Join(root, "etc/machine-id")
	os.Remove(mid)
	if err := os.Mkdir(mid, 0o755); err != nil {
		t.Fatal(err)
	}
	out := sh.run(t, root, identitytest.TokenB, "box")
	if !strings.Contains(out, "cannot write") || !strings.Contains(out, "not recorded") {
		t.Errorf("failing step: %q", out)
	}
	if identitytest.ReadTrimmed(t, filepath.Join(root, "etc/den/identity")) != identitytest.TokenA {
		t.Error("token recorded although a step failed")
	}
}

func TestInitramfsIdentityRegeneratesOpenSSHKeys(t *testing.T) {
	sh := newIdentityShell(t)
	testutil.NeedRoot(t, "chroot")
	// A root with an OpenSSH server: its ssh-keygen (here a script run by
	// the root's own /bin/sh, a static busybox) runs chrooted in it.
	root := t.TempDir()
	writeTestFile(t, filepath.Join(root, "etc/den/identity"), identitytest.TokenA+"\n")
	writeTestFile(t, filepath.Join(root, "etc/ssh/ssh_host_ed25519_key"), "old sshd key")
	writeTestFile(t, filepath.Join(root, "usr/sbin/sshd"), "")
	writeTestFile(t, filepath.Join(root, "usr/bin/ssh-keygen"), "#!/bin/sh\n[ \"$1\" = -A ] && echo new >/etc/ssh/ssh_host_ed25519_key\n")
	if err := os.Chmod(filepath.Join(root, "usr/bin/ssh-keygen"), 0o755); err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile(sh.busybox)
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(root, "bin/sh"), string(bb))
	if err := os.Chmod(filepath.Join(root, "bin/sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out := sh.run(t, root, identitytest.TokenB, "box"); !strings.Contains(out, "new identity for box") {
		t.Fatalf("output %q", out)
	}
	if k := identitytest.ReadTrimmed(t, filepath.Join(root, "etc/ssh/ssh_host_ed25519_key")); k != "new" {
		t.Errorf("sshd host key %q, want regenerated", k)
	}
}
