//go:build linux

package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	gossh "golang.org/x/crypto/ssh"
)

func TestInitOptions(t *testing.T) {
	o := initOptions([]string{"single", "--no-vsock", "-debug", "--unix", "/x.sock", "--bogus", "--no-serial"})
	if !o.noVsock || !o.noSerial || !o.debug || o.unix != "/x.sock" {
		t.Errorf("%+v", o)
	}
	if o := initOptions([]string{"--unix=/y"}); o.unix != "/y" || o.noVsock {
		t.Errorf("%+v", o)
	}
}

func TestUnknownCommand(t *testing.T) {
	if code := run("frobnicate", nil); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if code := run("version", nil); code != 0 {
		t.Errorf("version: exit %d", code)
	}
}

// TestBinarySmoke builds den-agent and runs it as a service would run it,
// in a private mount namespace (tmpfs on /run, a copy of /etc) so that it
// touches nothing of the host: host key creation, the unix listener, the
// lease socket with `den-agent hold`, exec and activity through the
// client, and a clean stop on SIGTERM.
// namespaceAgent skips unless the test can run den-agent in namespaces
// (root, unshare(1), not -short), and builds it: a context bounding the
// test, a temporary directory and the binary.
func namespaceAgent(t *testing.T) (context.Context, string, string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root for namespaces")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	dir := t.TempDir()
	return ctx, dir, buildAgent(ctx, t, dir)
}

func TestBinarySmoke(t *testing.T) {
	ctx, dir, bin := namespaceAgent(t)
	_, signer, err := agent.NewEd25519Key("test-host")
	if err != nil {
		t.Fatal(err)
	}
	authorized := filepath.Join(dir, "authorized_keys")
	os.WriteFile(authorized, gossh.MarshalAuthorizedKey(signer.PublicKey()), 0o644)
	sock := filepath.Join(dir, "agent.sock")
	etcCopy := filepath.Join(dir, "etc")
	script := `set -e
mount -t tmpfs none /run
mkdir -p ` + etcCopy + ` && cp -a /etc/. ` + etcCopy + `/ && mount --bind ` + etcCopy + ` /etc
mkdir -p /etc/den && cp ` + authorized + ` /etc/den/authorized_keys
` + bin + ` serve --no-vsock --no-serial --unix ` + sock + ` &
pid=$!
trap 'kill -TERM $pid; wait $pid; echo agent-exit=$?' TERM
i=0; while [ ! -S /run/den-agent.sock ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
` + bin + ` hold --for 1h --name smoke
` + bin + ` status
test -s /etc/den/ssh_host_ed25519_key && echo hostkey-ok
echo ready-for-client
wait $pid
`
	cmd := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "private", "sh", "-c", script)
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "ready-for-client") {
		if time.Now().After(deadline) {
			t.Fatalf("agent did not come up:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := out.String(); !strings.Contains(s, "smoke\tuntil ") || !strings.Contains(s, "hostkey-ok") {
		t.Errorf("hold/status/host key:\n%s", s)
	}
	dial := func(ctx context.Context) (net.Conn, error) { return net.Dial("unix", sock) }
	c, info, err := agent.WaitReady(ctx, dial, signer)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if info.PID1 || info.Version != agent.Version {
		t.Errorf("ready: %+v", info)
	}
	var stdout bytes.Buffer
	code, err := c.Exec(ctx, agent.ExecRequest{Cmd: []string{"sh", "-c", "cat /etc/den/authorized_keys | wc -l; exit 6"}, Stdout: &stdout})
	if err != nil || code != 6 || strings.TrimSpace(stdout.String()) != "1" {
		t.Errorf("exec: code %d err %v out %q", code, err, stdout.String())
	}
	a, err := c.Activity(ctx)
	if err != nil || len(a.Leases) != 1 || a.Leases[0].Name != "smoke" || !a.Held(time.Now()) {
		t.Errorf("activity leases %+v, %v", a.Leases, err)
	}
	c.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("agent did not stop on SIGTERM:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "agent-exit=0") {
		t.Errorf("agent exit:\n%s", out.String())
	}
}

type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
