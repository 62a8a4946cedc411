package users

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

func newSigner(t *testing.T) gossh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParseAuthorizedKey(t *testing.T) {
	s := newSigner(t)
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(s.PublicKey())))
	pk, err := ParseAuthorizedKey([]byte("# my key\n\n" + line + " alice@laptop\n"))
	if err != nil || pk.Comment != "alice@laptop" || pk.Line != line || pk.Fingerprint != gossh.FingerprintSHA256(s.PublicKey()) {
		t.Fatalf("parse: %+v %v", pk, err)
	}
	bad := map[string]string{
		"":                                    "no ssh public key",
		"hello":                               "no ssh public key",
		`command="ls" ` + line:                "key options are not supported",
		line + "\n" + line:                    "more than one",
		"-----BEGIN OPENSSH PRIVATE KEY-----": "private key",
	}
	for in, want := range bad {
		if _, err := ParseAuthorizedKey([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseAuthorizedKey(%q): %v; want %q", in, err, want)
		}
	}
}
