package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateHostKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "client_key")
	s1, err := LoadOrCreateHostKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v", err, st.Mode())
	}
	s2, err := LoadOrCreateHostKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if s1.PublicKey().Type() != "ssh-ed25519" || !bytes.Equal(s1.PublicKey().Marshal(), s2.PublicKey().Marshal()) {
		t.Fatal("reloaded key differs")
	}
	os.WriteFile(path, []byte("not a key"), 0o600)
	if _, err := LoadOrCreateHostKey(path); err == nil {
		t.Error("a corrupt key file loaded")
	}
}

func TestAuthorizedKeyArg(t *testing.T) {
	_, s, err := NewEd25519Key("x")
	if err != nil {
		t.Fatal(err)
	}
	arg := AuthorizedKeyArg(s.PublicKey())
	v, ok := strings.CutPrefix(arg, "den.key=ssh-ed25519:")
	if !ok || strings.ContainsAny(v, " \t\"") {
		t.Fatalf("arg %q", arg)
	}
	k, err := ParseAuthorizedKeyArg(strings.TrimPrefix(arg, "den.key="))
	if err != nil || !bytes.Equal(k.Marshal(), s.PublicKey().Marshal()) {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range []string{"ssh-ed25519", "ssh-rsa:" + v, "ssh-ed25519:!!!", "ssh-ed25519:AAAA"} {
		if _, err := ParseAuthorizedKeyArg(bad); err == nil {
			t.Errorf("ParseAuthorizedKeyArg(%q) accepted", bad)
		}
	}
}
