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
	gossh "golang.org/x/crypto/ssh"
)

const (
	tokenA = "0123456789abcdef0123456789abcdef"
	tokenB = "fedcba9876543210fedcba9876543210"
)

// fakeRoot is a guest root filesystem holding a source VM's identity.
func fakeRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for p, data := range map[string]string{
		"etc/hostname":                        "src\n",
		"etc/hosts":                           "127.0.0.1\tlocalhost\n127.0.1.1  src src.example.org   # the box\n# src\n",
		"etc/machine-id":                      "00000000000000000000000000000001\n",
		"etc/den/ssh_host_ed25519_key":        "old agent key",
		"etc/den/ssh_host_ed25519_key.pub":    "old agent key pub",
		"etc/den/authorized_keys":             "keep me",
		"etc/den/identity":                    tokenA + "\n",
		"etc/ssh/ssh_host_ecdsa_key":          "old sshd key",
		"etc/ssh/ssh_host_ecdsa_key.pub":      "old sshd key pub",
		"etc/ssh/ssh_host_ed25519_key-cert":   "old sshd cert",
		"etc/ssh/sshd_config":                 "keep me",
		"var/lib/systemd/random-seed":         "old seed",
		"var/lib/dbus/machine-id":             "00000000000000000000000000000001\n",
		"var/lib/systemd/credential.secret_x": "keep me",
	} {
		writeFile(t, filepath.Join(root, p), data)
	}
	return root
}

// tree maps every regular file under root to its content.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		m[rel] = string(data) + " " + fi.Mode().String() + " " + fi.ModTime().String()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func TestApplyBootIdentity(t *testing.T) {
	root := fakeRoot(t)
	etc := filepath.Join(root, "etc")

	// Same token as recorded: nothing changes.
	before := tree(t, root)
	made, err := ApplyBootIdentity(context.Background(), root, tokenA, "fork")
	if err != nil || made {
		t.Fatalf("same token: made %v, err %v", made, err)
	}
	if after := tree(t, root); !maps.Equal(before, after) {
		t.Fatalf("same token changed files:\nbefore %v\nafter  %v", before, after)
	}

	// A new token: a new identity.
	made, err = ApplyBootIdentity(context.Background(), root, tokenB, "fork")
	if err != nil || !made {
		t.Fatalf("new token: made %v, err %v", made, err)
	}
	if h := readTrim(t, filepath.Join(etc, "hostname")); h != "fork" {
		t.Errorf("hostname %q", h)
	}
	hosts := readTrim(t, filepath.Join(etc, "hosts"))
	if !strings.Contains(hosts, "127.0.1.1\tfork\tfork.example.org\t# the box") || !strings.Contains(hosts, "127.0.0.1\tlocalhost") || !strings.Contains(hosts, "# src") {
		t.Errorf("hosts:\n%s", hosts)
	}
	mid := readTrim(t, filepath.Join(etc, "machine-id"))
	if !validMachineID(mid) || mid == "00000000000000000000000000000001" {
		t.Errorf("machine-id %q", mid)
	}
	if st, err := os.Stat(filepath.Join(etc, "machine-id")); err != nil || st.Mode().Perm() != 0o444 {
		t.Errorf("machine-id mode: %v %v", st.Mode(), err)
	}
	if dbus := readTrim(t, filepath.Join(root, "var/lib/dbus/machine-id")); dbus != mid {
		t.Errorf("dbus machine-id %q, want %q", dbus, mid)
	}
	for _, p := range []string{"etc/den/ssh_host_ed25519_key", "etc/den/ssh_host_ed25519_key.pub",
		"etc/ssh/ssh_host_ecdsa_key", "etc/ssh/ssh_host_ecdsa_key.pub", "etc/ssh/ssh_host_ed25519_key-cert",
		"var/lib/systemd/random-seed"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s not removed (%v)", p, err)
		}
	}
	for _, p := range []string{"etc/den/authorized_keys", "etc/ssh/sshd_config", "var/lib/systemd/credential.secret_x"} {
		if readTrim(t, filepath.Join(root, p)) != "keep me" {
			t.Errorf("%s changed", p)
		}
	}
	if tok := ReadIdentityToken(root); tok != tokenB {
		t.Errorf("recorded token %q", tok)
	}

	// Again with the same token: idempotent.
	before = tree(t, root)
	made, err = ApplyBootIdentity(context.Background(), root, tokenB, "other")
	if err != nil || made {
		t.Fatalf("second run: made %v, err %v", made, err)
	}
	if after := tree(t, root); !maps.Equal(before, after) {
		t.Fatalf("second run changed files:\nbefore %v\nafter  %v", before, after)
	}

	// No hostname: kept; the machine-id still changes.
	made, err = ApplyBootIdentity(context.Background(), root, tokenA, "")
	if err != nil || !made {
		t.Fatalf("no hostname: made %v, err %v", made, err)
	}
	if h := readTrim(t, filepath.Join(etc, "hostname")); h != "fork" {
		t.Errorf("hostname %q after a boot without den.hostname", h)
	}
	if m2 := readTrim(t, filepath.Join(etc, "machine-id")); m2 == mid || !validMachineID(m2) {
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
	made, err := ApplyBootIdentity(context.Background(), root, tokenB, "bad_host!")
	if err != nil || !made || readTrim(t, filepath.Join(root, "etc/hostname")) != "den" || ReadIdentityToken(root) != tokenB {
		t.Fatalf("invalid hostname: made %v, err %v", made, err)
	}
	made, err = ApplyBootIdentity(context.Background(), root, tokenA, "box")
	if err != nil || !made {
		t.Fatalf("made %v, err %v", made, err)
	}
	if !validMachineID(readTrim(t, filepath.Join(root, "etc/machine-id"))) || readTrim(t, filepath.Join(root, "etc/hostname")) != "box" {
		t.Error("no machine-id or hostname written")
	}
	if st, err := os.Lstat(filepath.Join(root, "var/lib/dbus/machine-id")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("dbus machine-id link replaced: %v", err)
	}
	if ReadIdentityToken(root) != tokenA {
		t.Error("token not recorded")
	}
}

func TestApplyBootIdentityErrors(t *testing.T) {
	root := fakeRoot(t)
	for _, tok := range []string{"", "short", strings.ToUpper(tokenB), tokenB + "0", "g123456789abcdef0123456789abcdef"} {
		if _, err := ApplyBootIdentity(context.Background(), root, tok, "fork"); err == nil {
			t.Errorf("token %q accepted", tok)
		}
	}
	if ReadIdentityToken(root) != tokenA {
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
	made, err := ApplyBootIdentity(context.Background(), root, tokenB, "fork")
	if err == nil || !made || !strings.Contains(err.Error(), "machine-id") {
		t.Fatalf("failing step: made %v, err %v", made, err)
	}
	if ReadIdentityToken(root) != tokenA {
		t.Error("token recorded although a step failed")
	}
	if readTrim(t, filepath.Join(root, "etc/hostname")) != "fork" {
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
	rep, err := c.NewIdentityToken(testCtx(t), "fork-3", tokenB)
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
	if tok := ReadIdentityToken(root); tok != tokenB {
		t.Errorf("recorded token %q", tok)
	}
	if h := readTrim(t, filepath.Join(s.etc, "hostname")); h != "fork-3" || rep.Hostname != "fork-3" {
		t.Errorf("hostname file %q, reply %q", h, rep.Hostname)
	}
	matches, _ := filepath.Glob(filepath.Join(s.etc, "ssh/ssh_host_*"))
	if len(matches) != 0 {
		t.Errorf("sshd host keys left: %v", matches)
	}
	if readTrim(t, filepath.Join(s.etc, "ssh/sshd_config")) != "keep me" {
		t.Error("sshd_config changed")
	}
	if _, err := os.Stat(filepath.Join(root, "var/lib/systemd/random-seed")); !os.IsNotExist(err) {
		t.Errorf("random seed not removed: %v", err)
	}
	// A cold boot with the same den.identity keeps this identity.
	if made, err := ApplyBootIdentity(context.Background(), root, tokenB, "fork-3"); made || err != nil {
		t.Errorf("cold boot after NewIdentity: made %v, err %v", made, err)
	}

	// Without a token the recorded one stays; the key still rotates.
	rep3, err := c2.NewIdentity(testCtx(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if rep3.HostKey == rep.HostKey || ReadIdentityToken(root) != tokenB {
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
	c := ParseCmdline("console=ttyS0 den.hostname=box den.identity=" + tokenA + "\n")
	if c.Identity != tokenA || c.Hostname != "box" {
		t.Fatalf("%+v", c)
	}
}

func TestBootIdentityRegeneratesOpenSSHKeys(t *testing.T) {
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Skip("no ssh-keygen")
	}
	root := fakeRoot(t)
	writeFile(t, filepath.Join(root, "usr/sbin/sshd"), "")
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(keygen, filepath.Join(root, "usr/bin/ssh-keygen")); err != nil {
		t.Fatal(err)
	}
	if made, err := ApplyBootIdentity(context.Background(), root, tokenB, "fork"); err != nil || !made {
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
