// Package testutil holds what den's tests share: a log sink that
// goroutines may write together, and fresh SSH keys.
package testutil

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Buffer is a bytes.Buffer safe for concurrent use: a log sink.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// PublicKey is a fresh ed25519 public key in authorized_keys form.
func PublicKey(t testing.TB) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
}
