package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sys/unix"
)

// The integration tests run real programs: bin/juicefs and bin/minio built
// by `make deps` (or $DEN_JUICEFS, $DEN_MINIO), FUSE, and PostgreSQL from
// the machine's packages. Under -short they are skipped; otherwise a
// missing piece fails the test with what to do, never a silent skip.

func needIntegration(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: real FUSE mounts (run without -short)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("storage integration tests need root (FUSE mounts, killing mount processes)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("storage integration tests need /dev/fuse: %v", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("storage integration tests need fusermount3: apt-get install fuse3 (scripts/deps-apt.sh)")
	}
}

// tool finds a binary built by scripts/deps-tools.sh.
func tool(t *testing.T, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", env, p, err)
		}
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found at %s: run `make deps` (scripts/deps-tools.sh builds it) or set %s", name, p, env)
	}
	return p
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// minioServer is a real MinIO on a loopback port with a temporary data dir.
type minioServer struct {
	t        *testing.T
	bin      string
	dir      string
	addr     string
	console  string
	user     string
	password string
	cmd      *exec.Cmd
	exited   <-chan struct{}
}

func (m *minioServer) Endpoint() string { return "http://" + m.addr }

func startMinIO(t *testing.T) *minioServer {
	t.Helper()
	m := &minioServer{
		t:        t,
		bin:      tool(t, "minio", "DEN_MINIO"),
		dir:      t.TempDir(),
		addr:     fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		console:  fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		user:     "denadmin",
		password: "den-test-secret-0123",
	}
	m.Start()
	t.Cleanup(m.Stop)
	return m
}

// Start starts (or restarts) the server and waits until it is ready.
func (m *minioServer) Start() {
	t := m.t
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(m.dir, "..", "minio.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(m.bin, "server", "--address", m.addr, "--console-address", m.console, m.dir)
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+m.user, "MINIO_ROOT_PASSWORD="+m.password,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	exited, err := testutil.StartLocked(cmd)
	if err != nil {
		t.Fatalf("start minio: %v", err)
	}
	m.cmd = cmd
	m.exited = exited
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Ready means an authenticated S3 call works: the health
		// endpoint answers before the server takes requests.
		_, err := m.client(t).ListBuckets(context.Background())
		if err == nil {
			return
		}
		select {
		case <-m.exited:
			t.Fatalf("minio exited at start: see %s", logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("minio not ready after 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (m *minioServer) client(t *testing.T) *minio.Client {
	cl, err := minio.New(m.addr, &minio.Options{Creds: credentials.NewStaticV4(m.user, m.password, ""), MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// Stop stops the server (idempotent).
func (m *minioServer) Stop() {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		<-m.exited
	}
	m.cmd = nil
}

// openVolume opens a volume with fast supervision for tests and unmounts it
// (lazily if need be) when the test ends, so no mount outlives a test.
func openVolume(t *testing.T, cfg Config) *JuiceFS {
	t.Helper()
	if cfg.JuiceFS == "" {
		cfg.JuiceFS = tool(t, "juicefs", "DEN_JUICEFS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { cleanupVolume(t, v) })
	return v
}

func cleanupVolume(t *testing.T, v *JuiceFS) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := v.Unmount(ctx); err != nil {
		t.Logf("cleanup: %v", err)
	}
	if _, ok, _ := findMount(v.Root()); ok {
		exec.Command("fusermount3", "-u", "-z", v.Root()).Run()
		unix.Unmount(v.Root(), unix.MNT_DETACH)
	}
}

// fastSupervision shortens the supervisor's timings for fault tests.
func fastSupervision(v *JuiceFS) {
	v.stopSupervising() // stop the default supervisor, start one with test timings
	v.mu.Lock()
	v.closed = false
	v.mu.Unlock()
	v.opts = superviseOptions{interval: 200 * time.Millisecond, timeout: time.Second, failures: 3, mountTimeout: 60 * time.Second, backoffMax: 2 * time.Second}
	v.stop = make(chan struct{})
	v.done = make(chan struct{})
	go v.supervise()
}

func sha(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeAt writes n bytes of a deterministic pattern (seeded) at off, fsynced.
func writeAt(t *testing.T, path string, off int64, n int, seed byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := pattern(n, seed)
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
}

func pattern(n int, seed byte) []byte {
	buf := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range buf {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		buf[i] = byte(x)
	}
	return buf
}

func waitEvent(t *testing.T, ch <-chan Event, kind EventKind, within time.Duration) Event {
	t.Helper()
	deadline := time.After(within)
	var seen []string
	for {
		select {
		case e := <-ch:
			t.Logf("event: %s", e)
			if e.Kind == kind {
				return e
			}
			seen = append(seen, string(e.Kind))
		case <-deadline:
			t.Fatalf("no %s event within %s (saw %s)", kind, within, strings.Join(seen, ", "))
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func containsBytes(b []byte, s string) bool { return strings.Contains(string(b), s) }
