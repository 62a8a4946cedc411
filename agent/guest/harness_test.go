//go:build linux

package guest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/testutil"
	gossh "golang.org/x/crypto/ssh"
)

// testTimeout bounds every test's agent calls.
const testTimeout = 30 * time.Second

// harness is an agent server on a unix socket with a fake System.
type harness struct {
	t         *testing.T
	srv       *Server
	sys       *System
	fake      *fakeSys
	clientKey gossh.Signer
	hostKey   gossh.Signer
	user      string
	home      string
	etc       string
	sock      string
}

// fakeSys records what the control requests asked of the system.
type fakeSys struct {
	mu       sync.Mutex
	clock    []time.Time
	hostname []string
	entropy  [][]byte
	poweroff []bool
	frozen   []string // currently frozen, in freeze order
	events   []string // "freeze /x", "thaw /x"
	mounts   []string
	failOn   string // Freeze of this mount fails
}

func (f *fakeSys) Mounts() ([]string, error) { return f.mounts, nil }

func (f *fakeSys) Freeze(m string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m == f.failOn {
		return fmt.Errorf("fake freeze failure")
	}
	f.frozen = append(f.frozen, m)
	f.events = append(f.events, "freeze "+m)
	return nil
}

func (f *fakeSys) Thaw(m string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.frozen {
		if x == m {
			f.frozen = append(f.frozen[:i], f.frozen[i+1:]...)
			f.events = append(f.events, "thaw "+m)
			return nil
		}
	}
	return fmt.Errorf("thaw %s: not frozen", m)
}

func (f *fakeSys) snapshot() (frozen, events []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.frozen...), append([]string(nil), f.events...)
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	_, hostKey, err := agent.NewEd25519Key("host")
	if err != nil {
		t.Fatal(err)
	}
	_, clientKey, err := agent.NewEd25519Key("client")
	if err != nil {
		t.Fatal(err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	etc, home := filepath.Join(dir, "etc"), filepath.Join(dir, "home")
	for _, d := range []string{etc, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	passwd := fmt.Sprintf("%s:x:%s:%s:test:%s:/bin/sh\n", u.Username, u.Uid, u.Gid, home)
	writeFile(t, filepath.Join(etc, "passwd"), passwd)
	fake := &fakeSys{mounts: []string{"/", "/data", "/data/sub"}}
	sys := &System{
		SetClock: func(t time.Time) error {
			fake.mu.Lock()
			defer fake.mu.Unlock()
			fake.clock = append(fake.clock, t)
			return nil
		},
		Freezer: fake,
		SetHostname: func(h string) error {
			fake.mu.Lock()
			defer fake.mu.Unlock()
			fake.hostname = append(fake.hostname, h)
			return nil
		},
		Reseed: func(e []byte) error {
			fake.mu.Lock()
			defer fake.mu.Unlock()
			fake.entropy = append(fake.entropy, e)
			return nil
		},
		Poweroff: func(reboot bool) {
			fake.mu.Lock()
			defer fake.mu.Unlock()
			fake.poweroff = append(fake.poweroff, reboot)
		},
		EtcDir:  etc,
		ProcDir: "/proc",
	}
	srv, err := New(Config{
		HostKey:        hostKey,
		AuthorizedKeys: func() ([]gossh.PublicKey, error) { return []gossh.PublicKey{clientKey.PublicKey()}, nil },
		System:         sys,
		Logger:         testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &harness{t: t, srv: srv, sys: sys, fake: fake, clientKey: clientKey, hostKey: hostKey,
		user: u.Username, home: home, etc: etc, sock: sock}
}

// dial connects a client to the harness's unix socket.
func (h *harness) dial() *agent.Client {
	h.t.Helper()
	c, err := h.dialWith(h.clientKey)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

func (h *harness) dialWith(key gossh.Signer, opts ...agent.DialOption) (*agent.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn, err := net.Dial("unix", h.sock)
	if err != nil {
		return nil, err
	}
	return agent.Dial(ctx, conn, key, append([]agent.DialOption{agent.WithUser(h.user)}, opts...)...)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testLogger keeps the server's log and prints it if the test fails.
func testLogger(t *testing.T) *slog.Logger {
	buf := &testutil.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// run executes a command line and returns status, stdout and stderr.
func run(t *testing.T, c *agent.Client, req agent.ExecRequest) (int, string, string) {
	t.Helper()
	var out, errb testutil.Buffer
	req.Stdout, req.Stderr = &out, &errb
	code, err := c.Exec(testCtx(t), req)
	if err != nil {
		t.Fatalf("exec %q %q: %v", req.Cmd, req.CmdLine, err)
	}
	return code, out.String(), errb.String()
}

var _ io.Writer = (*testutil.Buffer)(nil)
