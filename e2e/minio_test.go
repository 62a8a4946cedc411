package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/netns"
	"github.com/denhq/den/internal/testutil"
)

// minio is a MinIO server on 127.0.0.1 for a test, or on an address in
// a network namespace (ns).
type minio struct {
	t    testing.TB
	bin  string
	dir  string
	ns   string
	addr string
	cmd  *exec.Cmd
	// exited is closed when cmd has exited.
	exited <-chan struct{}
}

const (
	minioUser     = "denadmin"
	minioPassword = "den-e2e-secret-0123"
)

func startMinio(t testing.TB) *minio {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return startMinioIn(t, "", addr)
}

// startMinioIn starts MinIO on addr in network namespace ns ("": the
// test's).
func startMinioIn(t testing.TB, ns, addr string) *minio {
	t.Helper()
	bin := filepath.Join(repoRoot(t), "bin", "minio")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("bin/minio not built (make deps): %v", err)
	}
	m := &minio{t: t, bin: bin, dir: t.TempDir(), ns: ns, addr: addr}
	m.start()
	t.Cleanup(m.stop)
	return m
}

func (m *minio) start() {
	m.t.Helper()
	m.cmd = exec.Command(m.bin, "server", "--address", m.addr, "--console-address", "127.0.0.1:0", m.dir)
	m.cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+minioUser, "MINIO_ROOT_PASSWORD="+minioPassword,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=1")
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	exited, err := testutil.StartLockedIn(m.ns, m.cmd)
	if err != nil {
		m.t.Fatal(err)
	}
	m.exited = exited
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: netns.Dialer(m.ns)}}
	if m.ns == "" {
		hc = http.DefaultClient
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := hc.Get("http://" + m.addr + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.t.Fatal("minio not ready within 60s")
}

func (m *minio) stop() {
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Kill()
		<-m.exited
		m.cmd = nil
	}
}

// TestMinIOOutage: with a VM on a volume in MinIO, MinIO goes away and
// the daemon is killed meanwhile. The restarted daemon adopts the VM with
// MinIO still down; once MinIO is back, the data synced before the
// outage is there, new writes land, and checkpoints work.
func TestMinIOOutage(t *testing.T) {
	m := startMinio(t)
	d := startDaemonIn(t, func(dir string) []string {
		secrets := filepath.Join(dir, "secrets.json")
		data, _ := json.Marshal(map[string]string{"access_key": minioUser, "secret_key": minioPassword})
		if err := os.WriteFile(secrets, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := map[string]any{
			"state_dir":    filepath.Join(dir, "state", "juicefs"),
			"s3":           map[string]any{"endpoint": "http://" + m.addr, "bucket": "den-e2e", "create_bucket": true},
			"secrets_file": secrets,
		}
		data, _ = json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(dir, "volume.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--volume-config", filepath.Join(dir, "volume.json")}
	})
	d.must("create", "s3vm", "--memory", "256M", "--idle-timeout", "0")
	d.must("exec", "s3vm", "--", "sh", "-c", startWork)
	m.stop()
	d.kill()
	d.start()
	if vm := d.info("s3vm"); vm.State != "running" {
		t.Fatalf("adopted with minio down: %+v", vm)
	}
	m.start()
	if out := d.must("exec", "s3vm", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after the outage: %q", out)
	}
	d.must("exec", "s3vm", "--", "sh", "-c", "echo after > /root/after; sync")
	d.must("checkpoint", "s3vm")
	d.must("restore", "s3vm", "cp-1", "--no-save")
	if out := d.must("exec", "s3vm", "--", "sh", "-c", "cat /root/after; "+checkWork); out != "after\nv1\nalive\n" {
		t.Fatalf("restore after the outage: %q", out)
	}
}
