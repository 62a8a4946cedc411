// Package identitytest checks a guest root filesystem before and after a new identity, for the tests of each implementation of it.
//
// The implementations are the agent's ApplyBootIdentity
// (agent/guest/identity.go) and the initramfs's den_identity
// (image/init-initramfs.sh): both must do the same to the root that
// SourceRoot makes, which CheckNew checks.
package identitytest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Two den.identity tokens: SourceRoot's is TokenA.
const (
	TokenA = "0123456789abcdef0123456789abcdef"
	TokenB = "fedcba9876543210fedcba9876543210"
)

// sourceMachineID is SourceRoot's machine-id.
const sourceMachineID = "00000000000000000000000000000001"

// sourceFiles is SourceRoot's content.
var sourceFiles = map[string]string{
	"etc/hostname":                        "src\n",
	"etc/hosts":                           "127.0.0.1\tlocalhost\n127.0.1.1  src src.example.org   # the box\n# src\n",
	"etc/machine-id":                      sourceMachineID + "\n",
	"etc/den/ssh_host_ed25519_key":        "old agent key",
	"etc/den/ssh_host_ed25519_key.pub":    "old agent key pub",
	"etc/den/authorized_keys":             "keep me",
	"etc/den/identity":                    TokenA + "\n",
	"etc/ssh/ssh_host_ecdsa_key":          "old sshd key",
	"etc/ssh/ssh_host_ecdsa_key.pub":      "old sshd key pub",
	"etc/ssh/ssh_host_ed25519_key-cert":   "old sshd cert",
	"etc/ssh/sshd_config":                 "keep me",
	"var/lib/systemd/random-seed":         "old seed",
	"var/lib/systemd/credential.secret_x": "keep me",
	"var/lib/dbus/machine-id":             sourceMachineID + "\n",
}

// removedFiles are the files of SourceRoot a new identity removes; the
// other files holding "keep me" stay as they are.
var removedFiles = []string{
	"etc/den/ssh_host_ed25519_key",
	"etc/den/ssh_host_ed25519_key.pub",
	"etc/ssh/ssh_host_ecdsa_key",
	"etc/ssh/ssh_host_ecdsa_key.pub",
	"etc/ssh/ssh_host_ed25519_key-cert",
	"var/lib/systemd/random-seed",
}

// SourceRoot returns a new guest root filesystem holding a source VM's
// identity, made for TokenA: hostname src (also in etc/hosts), a
// machine-id (also D-Bus's copy), the agent's and OpenSSH's host keys, a
// saved random seed, and files a new identity keeps.
func SourceRoot(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for p, data := range sourceFiles {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Tree maps every regular file under root to its content, mode and
// modification time.
func Tree(t testing.TB, root string) map[string]string {
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

// ReadTrimmed returns the content of the file at path without leading and
// trailing white space.
func ReadTrimmed(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// IsMachineID says whether s is a machine-id: 32 lowercase hex digits.
func IsMachineID(s string) bool {
	return len(s) == 32 && strings.Trim(s, "0123456789abcdef") == ""
}

// CheckNew checks that root, made by SourceRoot, has a new identity for
// hostname and token: hostname in etc/hostname and in place of src in
// etc/hosts, a new machine-id (mode 0444) also in D-Bus's copy, no host
// keys and no random seed, the other files unchanged, token recorded and
// no file left that the source did not have (a temporary file).
func CheckNew(t testing.TB, root, hostname, token string) {
	t.Helper()
	etc := filepath.Join(root, "etc")
	if h := ReadTrimmed(t, filepath.Join(etc, "hostname")); h != hostname {
		t.Errorf("hostname %q, want %q", h, hostname)
	}
	hosts := ReadTrimmed(t, filepath.Join(etc, "hosts"))
	if !strings.Contains(hosts, "127.0.1.1\t"+hostname+"\t"+hostname+".example.org\t# the box") ||
		!strings.Contains(hosts, "127.0.0.1\tlocalhost") || !strings.Contains(hosts, "# src") {
		t.Errorf("hosts:\n%s", hosts)
	}
	mid := ReadTrimmed(t, filepath.Join(etc, "machine-id"))
	if !IsMachineID(mid) || mid == sourceMachineID {
		t.Errorf("machine-id %q", mid)
	}
	if st, err := os.Stat(filepath.Join(etc, "machine-id")); err != nil {
		t.Errorf("machine-id: %v", err)
	} else if st.Mode().Perm() != 0o444 {
		t.Errorf("machine-id mode %v, want 0444", st.Mode())
	}
	if d := ReadTrimmed(t, filepath.Join(root, "var/lib/dbus/machine-id")); d != mid {
		t.Errorf("dbus machine-id %q, want %q", d, mid)
	}
	for _, p := range removedFiles {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s not removed (%v)", p, err)
		}
	}
	for p, data := range sourceFiles {
		if data == "keep me" && ReadTrimmed(t, filepath.Join(root, p)) != data {
			t.Errorf("%s changed", p)
		}
	}
	if tok := ReadTrimmed(t, filepath.Join(etc, "den/identity")); tok != token {
		t.Errorf("recorded token %q, want %q", tok, token)
	}
	var left []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if _, ok := sourceFiles[rel]; !ok {
			left = append(left, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		slices.Sort(left)
		t.Errorf("files left that the source root did not have (temporary files?): %v", left)
	}
}
