// Package testutil holds what den's tests share: a log sink that
// goroutines may write together, fresh SSH keys, bounded waits, damage
// to a file, the skip of a test that needs root, servers that die with
// the test binary (in a network namespace of their own if asked), and a
// JuiceFS mount's count of retried transactions.
package testutil

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/netns"
	"github.com/denhq/den/internal/poll"
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

// WaitTimeout bounds WaitFor: long enough for a loaded machine, and
// only spent when a test fails.
const WaitTimeout = 30 * time.Second

// WaitFor polls cond until it holds, failing t after WaitTimeout; what
// says what was waited for.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitForWithin(t, WaitTimeout, what, cond)
}

// WaitForWithin is WaitFor with a bound of its own.
func WaitForWithin(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll.Until(within, cond) {
		t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

// FlipBytes inverts two bytes of the file at path at off (twice restores
// them), synced: the damage integrity tests look for.
func FlipBytes(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0], b[1] = ^b[0], ^b[1]
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// NeedRoot skips t unless it runs as root; why says what needs it.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: %s", why)
	}
}

// StartLocked starts cmd from a goroutine locked to its OS thread, which
// then waits for the process: Pdeathsig fires when the thread that forked
// exits, so the server dies with the test binary, and only then. The
// returned channel is closed when the process has exited.
func StartLocked(cmd *exec.Cmd) (<-chan struct{}, error) { return StartLockedIn("", cmd) }

// StartLockedIn is StartLocked with the process in network namespace ns
// (a name from ip netns; "" is the test's own): the forking thread
// enters it first, and the process inherits it.
func StartLockedIn(ns string, cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := netns.Enter(ns); err != nil {
			started <- err
			return
		}
		err := cmd.Start()
		started <- err
		if err != nil {
			return
		}
		cmd.Wait()
		close(exited)
	}()
	return exited, <-started
}

// JuiceFSRetries is how many metadata transactions the JuiceFS mount at
// root has run again, from its statistics file (.stats).
func JuiceFSRetries(root string) (float64, error) {
	b, err := os.ReadFile(filepath.Join(root, ".stats"))
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if name, value, ok := strings.Cut(line, " "); ok && strings.HasPrefix(name, "juicefs_transaction_restart") {
			v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", filepath.Join(root, ".stats"), line, err)
			}
			sum += v
		}
	}
	return sum, nil
}
