//go:build linux

package guest

import (
	"crypto/ed25519"
	"crypto/rand"
	"os/exec"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
	sshagent "golang.org/x/crypto/ssh/agent"
)

func TestAgentForwarding(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	keyring := sshagent.NewKeyring()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	if err := keyring.Add(sshagent.AddedKey{PrivateKey: priv, Comment: "forwarded-key"}); err != nil {
		t.Fatal(err)
	}
	if err := sshagent.ForwardToAgent(c.SSH(), keyring); err != nil {
		t.Fatal(err)
	}
	s, err := c.SSH().NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := sshagent.RequestAgentForwarding(s); err != nil {
		t.Fatal(err)
	}
	cmd := `test -S "$SSH_AUTH_SOCK" && echo sock-ok`
	_, hasSSHAdd := exec.LookPath("ssh-add")
	if hasSSHAdd == nil {
		cmd += `; ssh-add -l`
	}
	out, err := s.Output(cmd)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "sock-ok") {
		t.Fatalf("no agent socket: %q", out)
	}
	if hasSSHAdd == nil {
		pub, _ := gossh.NewPublicKey(priv.Public())
		if !strings.Contains(string(out), gossh.FingerprintSHA256(pub)) {
			t.Errorf("ssh-add -l does not list the forwarded key: %q", out)
		}
	}
}
