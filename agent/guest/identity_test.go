//go:build linux

package guest

import (
	"context"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/identitytest"
	gossh "golang.org/x/crypto/ssh"
)

func TestApplyBootIdentity(t *testing.T) {
	root := identitytest.SourceRoot(t)
	etc := filepath.Join(root, "etc")

	// Same token as recorded: nothing changes.
	before := identitytest.Tree(t, root)
	made, err := ApplyBootIdentity(context.Background(), root, identitytest.TokenA, "fork")
	if err != nil || made {
		t.Fatalf("same token: made %v, err %v", made, err)
	}
	if after := identitytest.Tree(t, root); !maps.Equal(before, after) {
		t.Fatalf("same token changed files:\nbefore %v\nafter  %v", before, after)
	}

	// A new token: a new identity.
	made, err = ApplyBootIdentity(context.Background(), root, identitytest.TokenB, "fork")
	if err != nil || !made {
		t.Fatalf("new token: made %v, err %v", made, err)
	}
	identitytest.CheckNew(t, root, "fork", identitytest.TokenB)
	if tok := ReadIdentityToken(root); tok != identitytest.TokenB {
		t.Errorf("ReadIdentityToken %q", tok)
	}
	mid := identitytest.ReadTrimmed(t, filepath.Join(etc, "machine-id"))

	// Again with the same token: idempotent.
	before = identitytest.Tree(t, root)
	made, err = ApplyBootIdentity(context.Background(), root, identitytest.TokenB, "other")
	if err != nil || made {
		t.Fatalf("second run: made %v, err %v", made, err)
	}
	if after := identitytest.Tree(t, root); !maps.Equal(before, after) {
		t.Fatalf("second run changed files:\nbefore %v\nafter  %v", before, after)
	}

	// No hostname: kept; the machine-id still changes.
	made, err = ApplyBootIdentity(context.Background(), root, identitytest.TokenA, "")
	if err != nil || !made {
		t.Fatalf("no hostname: made %v, err %v", made, err)
	}
	if h := identitytest.ReadTrimmed(t, filepath.Join(etc, "hostname")); h != "fork" {
		t.Errorf("hostname %q after a boot without den.hostname", h)
	}
	if m2 := identitytest.ReadTrimmed(t, filepath.Join(etc, "machine-id")); m2 == mid || !identitytest.IsMachineID(m2) {
		t.Errorf("machine-id %q (was %q)", m2, mid)
	}
}

func TestApplyBootIdentityFreshImage(t *testing.T) {
	// The minimal image: no machine-id, no etc/den/identity, no key yet;
	// var/lib/dbus/machine-id a link (Debian) stays a link.
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "etc/hostname"), "den\n")
	if err := os.MkdirAll(filepath.Join(root, "var/lib/dbus"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/machine-id", filepath.Join(root, "var/lib/dbus/machine-id")); err != nil {
		t.Fatal(err)
	}
	// An invalid hostname is left out; the rest is done.
	made, err := ApplyBootIdentity(context.Background(), root, identitytest.TokenB, "bad_host!")
	if err != nil || !made || identitytest.ReadTrimmed(t, filepath.Join(root, "etc/hostname")) != "den" || ReadIdentityToken(root) != identitytest.TokenB {
		t.Fatalf("invalid hostname: made %v, err %v", made, err)
	}
	made, err = ApplyBootIdentity(context.Background(), root, identitytest.TokenA, "box")
	if err != nil || !made {
		t.Fatalf("made %v, err %v", made, err)
	}
	if !identitytest.IsMachineID(identitytest.ReadTrimmed(t, filepath.Join(root, "etc/machine-id"))) || identitytest.ReadTrimmed(t, filepath.Join(root, "etc/hostname")) != "box" {
		t.Error("no machine-id or hostname written")
	}
	if st, err := os.Lstat(filepath.Join(root, "var/lib/dbus/machine-id")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("dbus machine-id link replaced: %v", err)
	}
	if ReadIdentityToken(root) != identitytest.TokenA {
		t.Error("token not recorded")
	}
}

func TestApplyBootIdentityErrors(t *testing.T) {
	root := identitytest.SourceRoot(t)
	for _, tok := range []string{"", "short", strings.ToUpper(identitytest.TokenB), identitytest.TokenB + "0", "g123456789abcdef0123456789abcdef"} {
		if _, err := ApplyBootIdentity(context.Background(), root, tok, "fork"); err == nil {
			t.Errorf("token %q accepted", tok)
		}
	}
	if ReadIdentityToken(root) != identitytest.TokenA {
		t.Fatal("a refused request changed the recorded token")
	}
	// A step that fails leaves the token unrecorded: the next boot tries
	// again.
	mid := filepath.Join(root, "etc/machine-id")
	if err := os.Remove(mid); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mid, 0o755); err != nil {
		t.Fatal(err)
	}
	made, err := ApplyBootIdentity(context.Background(), root, identitytest.TokenB, "fork")
	if err == nil || !made || !strings.Contains(err.Error(), "machine-id") {
		t.Fatalf("failing step: made %v, err %v", made, err)
	}
	if ReadIdentityToken(root) != identitytest.TokenA {
		t.Error("token recorded although a step failed")
	}
	if identitytest.ReadTrimmed(t, filepath.Join(root, "etc/hostname")) != "fork" {
		t.Error("the other steps were not done")
	}
}

// identityServer is a harness whose agent keeps its host key in a file,
// as the real agent does.
type identityServer struct {
	*harness
	keyPath string
	sock    string
}

func newIdentityServer(t *testing.T) *identityServer {
	t.Helper()
	h := newHarness(t)
	keyPath := filepath.Join(h.etc, "den", "ssh_host_ed25519_key")
	key, err := agent.LoadOrCreateHostKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{
		HostKey:        key,
		HostKeyPath:    keyPath,
		AuthorizedKeys: func() ([]gossh.PublicKey, error) { return []gossh.PublicKey{h.clientKey.PublicKey()}, nil },
		System:         h.sys,
		Logger:         testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(filepath.Dir(h.sock), "identity.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &identityServer{harness: h, keyPath: keyPath, sock: sock}
}

// dialSeeing connects and returns the client and the host key it saw.
func (s *identityServer) dialSeeing(t *testing.T) (*agent.Client, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	var seen string
	c, err := agent.Dial(ctx, conn, s.clientKey, agent.WithUser(s.user), agent.WithHostKeyCallback(
		func(_ string, _ net.Addr, k gossh.PublicKey) error {
			seen = gossh.FingerprintSHA256(k)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, seen
}

func keyFileFingerprint(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := gossh.ParsePrivateKey(data)
	if err != nil {
		t.Fatal(err)
	}
	return gossh.FingerprintSHA256(k.PublicKey())
}

func TestNewIdentityRotatesHostKey(t *testing.T) {
	s := newIdentityServer(t)
	root := filepath.Dir(s.etc)
	writeFile(t, filepath.Join(s.etc, "ssh/ssh_host_ecdsa_key"), "old sshd key")
	writeFile(t, filepath.Join(s.etc, "ssh/ssh_host_ecdsa_key.pub"), "old sshd key pub")
	writeFile(t, filepath.Join(s.etc, "ssh/sshd_config"), "keep me")
	writeFile(t, filepath.Join(root, "var/lib/systemd/random-seed"), "old seed")

	c, fp1 := s.dialSeeing(t)
	if fp1 != keyFileFingerprint(t, s.keyPath) {
		t.Fatalf("agent serves %s, not the key in its file", fp1)
	}
	rep, err := c.NewIdentityToken(testCtx(t), "fork-3", identitytest.TokenB)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey([]byte(rep.HostKey))
	if err != nil {
		t.Fatalf("reply's host key %q: %v", rep.HostKey, err)
	}
	fp2 := gossh.FingerprintSHA256(pub)
	if fp2 == fp1 {
		t.Fatal("host key not rotated")
	}
	if got := keyFileFingerprint(t, s.keyPath); got != fp2 {
		t.Errorf("key file holds %s, reply says %s", got, fp2)
	}
	if st, err := os.Stat(s.keyPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v", err)
	}
	// The open connection keeps working; a new one sees the new key.
	if _, err := c.Ready(testCtx(t)); err != nil {
		t.Errorf("old connection after rotation: %v", err)
	}
	c2, seen := s.dialSeeing(t)
	if seen != fp2 {
		t.Errorf("new connection sees %s, want %s", seen, fp2)
	}
	if tok := ReadIdentityToken(root); tok != identitytest.TokenB {
		t.Errorf("recorded token %q", tok)
	}
	if h := identitytest.ReadTrimmed(t, filepath.Join(s.etc, "hostname")); h != "fork-3" || rep.Hostname != "fork-3" {
		t.Errorf("hostname file %q, reply %q", h, rep.Hostname)
	}
	matches, _ := filepath.Glob(filepath.Join(s.etc, "ssh/ssh_host_*"))
	if len(matches) != 0 {
		t.Errorf("sshd host keys left: %v", matches)
	}
	if identitytest.ReadTrimmed(t, filepath.Join(s.etc, "ssh/sshd_config")) != "keep me" {
		t.Error("sshd_config changed")
	}
	if _, err := os.Stat(filepath.Join(root, "var/lib/systemd/random-seed")); !os.IsNotExist(err) {
		t.Errorf("random seed not removed: %v", err)
	}
	// A cold boot with the same den.identity keeps this identity.
	if made, err := ApplyBootIdentity(context.Background(), root, identitytest.TokenB, "fork-3"); made || err != nil {
		t.Errorf("cold boot after NewIdentity: made %v, err %v", made, err)
	}

	// Without a token the recorded one stays; the key still rotates.
	rep3, err := c2.NewIdentity(testCtx(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if rep3.HostKey == rep.HostKey || ReadIdentityToken(root) != identitytest.TokenB {
		t.Errorf("token-less identity: key rotated %v, token %q", rep3.HostKey != rep.HostKey, ReadIdentityToken(root))
	}
	// A bad token is refused before anything changes.
	before := keyFileFingerprint(t, s.keyPath)
	if _, err := c2.NewIdentityToken(testCtx(t), "", "NOT-A-TOKEN"); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("bad token: %v", err)
	}
	if keyFileFingerprint(t, s.keyPath) != before {
		t.Error("a refused request rotated the key")
	}
}

func TestParseCmdlineIdentity(t *testing.T) {
	c := ParseCmdline("console=ttyS0 den.hostname=box den.identity=" + identitytest.TokenA + "\n")
	if c.Identity != identitytest.TokenA || c.Hostname != "box" {
		t.Fatalf("%+v", c)
	}
}

func TestBootIdentityRegeneratesOpenSSHKeys(t *testing.T) {
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Skip("no ssh-keygen")
	}
	root := identitytest.SourceRoot(t)
	writeFile(t, filepath.Join(root, "usr/sbin/sshd"), "")
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(keygen, filepath.Join(root, "usr/bin/ssh-keygen")); err != nil {
		t.Fatal(err)
	}
	if made, err := ApplyBootIdentity(context.Background(), root, identitytest.TokenB, "fork"); err != nil || !made {
		t.Fatalf("made %v, err %v", made, err)
	}
	data, err := os.ReadFile(filepath.Join(root, "etc/ssh/ssh_host_ed25519_key"))
	if err != nil {
		t.Fatalf("no new sshd host key: %v", err)
	}
	if _, err := gossh.ParsePrivateKey(data); err != nil {
		t.Fatalf("new sshd host key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ssh/ssh_host_ecdsa_key.pub")); err != nil {
		t.Errorf("no new ecdsa public key: %v", err)
	}
}
