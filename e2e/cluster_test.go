package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/pgtest"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// clusterEnv is what the hosts of a test cluster share: a real
// PostgreSQL (den's registry and the volume's metadata, each in a
// database of its own) and a real MinIO (the volume's data).
type clusterEnv struct {
	t     testing.TB
	pg    *pgtest.Server
	minio *minio
	dir   string
	lease time.Duration
}

func newClusterEnv(t testing.TB, lease time.Duration) *clusterEnv {
	c := &clusterEnv{t: t, pg: pgtest.Start(t), minio: startMinio(t), dir: t.TempDir(), lease: lease}
	c.pg.CreateDatabase(t, "den")
	c.pg.CreateDatabase(t, "den_volume")
	c.write("cluster-secrets.json", map[string]string{"registry_password": pgtest.Password})
	c.write("volume-secrets.json", map[string]string{"access_key": minioUser, "secret_key": minioPassword, "meta_password": pgtest.Password})
	return c
}

func (c *clusterEnv) write(name string, v any) string {
	c.t.Helper()
	data, _ := json.Marshal(v)
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// config writes host's cluster config and returns its path.
func (c *clusterEnv) config(host string) string {
	return c.write(host+".json", map[string]any{
		"host":         host,
		"registry":     c.pg.TCPURL("den"),
		"secrets_file": "cluster-secrets.json",
		"volume": map[string]any{
			"meta_url":     c.pg.TCPURL("den_volume"),
			"s3":           map[string]any{"endpoint": "http://" + c.minio.addr, "bucket": "den-cluster", "create_bucket": true},
			"secrets_file": "volume-secrets.json",
		},
		"lease": c.lease.String(),
	})
}

// host starts a daemon of the cluster.
func (c *clusterEnv) host(name string) *daemon {
	return startDaemonIn(c.t, c.setup(name))
}

// setup is the daemon setup of host name: its cluster config, and the
// unmount of the shared volume when the test ends, whatever teardown
// found.
func (c *clusterEnv) setup(name string) func(dir string) []string {
	return func(dir string) []string {
		c.t.Cleanup(func() {
			for _, m := range []string{"mnt-ro", "mnt"} {
				_ = syscall.Unmount(filepath.Join(dir, "state", "juicefs", m), syscall.MNT_DETACH)
			}
		})
		return []string{"--cluster", c.config(name)}
	}
}

// registrySetup is the daemon setup of a test that did not ask for one:
// none, or with DEN_E2E_REGISTRY=postgres a one-host cluster of its own
// (a real PostgreSQL and MinIO), so that the tests make test runs that
// way too exercise the PostgreSQL registry and the shared volume. Its
// lease is long: crash tests restart the daemon well within half of it.
func registrySetup(t testing.TB) func(dir string) []string {
	switch r := os.Getenv("DEN_E2E_REGISTRY"); r {
	case "", "sqlite":
		return nil
	case "postgres":
		return newClusterEnv(t, time.Minute).setup("e2e-host")
	default:
		t.Fatalf("DEN_E2E_REGISTRY=%q: want sqlite or postgres", r)
		return nil
	}
}

// registry opens den's record as the hosts do.
func (c *clusterEnv) registry() *registry.DB {
	c.t.Helper()
	db, err := registry.OpenPostgres(context.Background(), c.pg.DSN("den"))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { db.Close() })
	return db
}

type hostsJSON struct {
	Hosts []struct {
		Name  string `json:"name"`
		Alive bool   `json:"alive"`
		This  bool   `json:"this"`
	} `json:"hosts"`
	Registry string `json:"registry"`
}

func hostsOf(t *testing.T, d *daemon) hostsJSON {
	t.Helper()
	var h hostsJSON
	if err := json.Unmarshal([]byte(d.must("hosts", "--json")), &h); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestClusterFence: hosts share a PostgreSQL registry and a volume in
// MinIO with its metadata in PostgreSQL. A restart of PostgreSQL leaves
// the live host and its VM running. One host is live at a time; a
// second is refused while the first holds the cluster's lease. When the
// live host's daemon freezes (SIGSTOP), its fence guard kills its VMM
// before the lease expires, so that when another host takes over (after
// the lease and a grace) no two VMMs of the VM ever run; the VM boots on
// the new host from its disk, with what it had synced. When the frozen
// daemon thaws, its next renewal is refused (the lease's generation
// moved on) and it exits without touching anything.
func TestClusterFence(t *testing.T) {
	c := newClusterEnv(t, 6*time.Second)
	a := c.host("host-a")
	h := hostsOf(t, a)
	if h.Registry != "postgres" || len(h.Hosts) != 1 || h.Hosts[0].Name != "host-a" || !h.Hosts[0].Alive || !h.Hosts[0].This {
		t.Fatalf("hosts on host-a: %+v", h)
	}
	a.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	a.must("exec", "box", "--", "sh", "-c", "echo from-a > /root/mark; sync")
	vmms := a.vmmPIDs("box")
	if len(vmms) != 1 {
		t.Fatalf("vmm processes of box on host-a: %v", vmms)
	}

	// PostgreSQL restarts under the live host: its renewals retry within
	// the fence's deadline, and the VM goes on. (Its disk may not: JuiceFS
	// fails the writes it commits while its metadata engine is away, see
	// docs/cluster.md; nothing here writes to the guest's disk meanwhile.)
	if err := c.pg.Restart(); err != nil {
		t.Fatal(err)
	}
	a.must("exec", "box", "--", "true")
	if got := a.vmmPIDs("box"); !slices.Equal(got, vmms) {
		t.Fatalf("box's VMM after PostgreSQL restarted: %v, was %v", got, vmms)
	}
	if h := hostsOf(t, a); len(h.Hosts) != 1 || !h.Hosts[0].Alive {
		t.Fatalf("hosts after PostgreSQL restarted: %+v", h)
	}

	// A second host is refused, in one line, while host-a is live.
	den, images := requireHost(t)
	bstate := filepath.Join(t.TempDir(), "state")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, den, "daemon", "--state-dir", bstate, "--socket", filepath.Join(bstate, "den.sock"),
		"--images", images.Path(), "--ssh-listen", "off", "--net", "user", "--vmm-user", "-", "--cluster", c.config("host-b")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another daemon is the live host of this cluster") ||
		!strings.Contains(string(out), `"host-a"`) {
		t.Fatalf("a second live host: %v\n%s", err, out)
	}

	// host-a's daemon freezes: its fence guard kills the VMM while the
	// lease is still held.
	db := c.registry()
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()
	if !eventually(time.Minute, func() bool { return len(a.vmmPIDs("box")) == 0 }) {
		t.Fatal("the fence did not stop host-a's VMM while its daemon was frozen")
	}
	l, err := db.GetLease(context.Background(), "@cluster")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Held() || l.Host != "host-a" {
		t.Fatalf("host-a's VMM was stopped only after its lease lapsed (or the lease moved): %+v", l)
	}
	t.Logf("the fence stopped host-a's VMM %s before its lease expired", l.Expires.Sub(l.Now))

	// host-b takes over once the lease lapsed past the grace.
	if !eventually(time.Minute, func() bool {
		exp, err := db.ExpiredLeases(context.Background(), c.lease/2)
		return err == nil && len(exp) == 1 && exp[0].VM == "@cluster"
	}) {
		t.Fatal("host-a's lease did not lapse")
	}
	// A write host-a's volume client commits late, through a file it
	// had open, must never reach the disk host-b boots.
	late, err := os.OpenFile(filepath.Join(a.volumeMount(), string(storage.VMDisk("box"))), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	st, err := late.Stat()
	if err != nil {
		t.Fatal(err)
	}
	lateAt := st.Size() - 4096

	b := c.host("host-b")
	mark := []byte("late write from host-a")
	if _, err := late.WriteAt(mark, lateAt); err != nil {
		t.Fatal(err)
	}
	if err := late.Sync(); err != nil {
		// JuiceFS may refuse to commit it (the file is no longer linked).
		t.Logf("host-a's client did not commit the late write: %v", err)
	}
	got := make([]byte, len(mark))
	onB, err := os.Open(filepath.Join(b.volumeMount(), string(storage.VMDisk("box"))))
	if err != nil {
		t.Fatal(err)
	}
	_, err = onB.ReadAt(got, lateAt)
	onB.Close()
	if err != nil || bytes.Equal(got, mark) {
		t.Fatalf("host-b's disk of box holds host-a's late write (%q, %v)", got, err)
	}
	h = hostsOf(t, b)
	if len(h.Hosts) != 2 || h.Hosts[0].Name != "host-a" || h.Hosts[0].Alive || h.Hosts[1].Name != "host-b" || !h.Hosts[1].Alive || !h.Hosts[1].This {
		t.Fatalf("hosts on host-b: %+v", h)
	}
	if vm := b.info("box"); vm.State != "stopped" || !strings.Contains(vm.Reason, "ran on host host-a, whose lease this host took over: its disk was cloned afresh") {
		t.Fatalf("box on host-b after the takeover: %+v", vm)
	}
	if out := b.must("exec", "box", "--", "cat", "/root/mark"); out != "from-a\n" {
		t.Fatalf("box booted on host-b: /root/mark %q", out)
	}
	if n := len(b.vmmPIDs("box")); n != 1 {
		t.Fatalf("%d VMMs of box on host-b", n)
	}

	// host-a thaws: its renewal is refused and it exits; its VMM stays
	// stopped.
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed = true
	exited := make(chan error, 1)
	go func() { exited <- a.cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatal("host-a's daemon exited cleanly after losing the cluster lease")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("host-a's daemon kept running after losing the cluster lease")
	}
	log, _ := os.ReadFile(a.logPath)
	if !strings.Contains(string(log), "lost the cluster lease") {
		t.Fatalf("host-a's log does not say it lost the lease:\n%s", log)
	}
	if n := len(a.vmmPIDs("box")); n != 0 {
		t.Fatalf("host-a runs %d VMMs of box after thawing", n)
	}
	if vm := b.info("box"); vm.State != "running" {
		t.Fatalf("box on host-b after host-a thawed: %+v", vm)
	}
}

// TestClusterConfigRefused: a cluster config whose volume only this host
// can mount, or whose registry is not PostgreSQL, is refused in one line
// before anything is mounted.
func TestClusterConfigRefused(t *testing.T) {
	den, images := requireHost(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  map[string]any
		want string
	}{
		{"local volume", map[string]any{"host": "h", "registry": "postgres://den@127.0.0.1:1/den", "volume": map[string]any{}},
			"the volume keeps its data on this host"},
		{"sqlite registry", map[string]any{"host": "h", "registry": "sqlite3:///tmp/x.db"}, "want postgres://"},
		{"password in the url", map[string]any{"host": "h", "registry": "postgres://den:pw@127.0.0.1:1/den"}, "carries a password"},
		{"bad host", map[string]any{"host": "-h", "registry": "postgres://den@127.0.0.1:1/den"}, "bad host name"},
	} {
		p := filepath.Join(dir, "c.json")
		data, _ := json.Marshal(tc.cfg)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		state := filepath.Join(dir, "state")
		out, err := exec.Command(den, "daemon", "--state-dir", state, "--socket", filepath.Join(dir, "den.sock"),
			"--images", images.Path(), "--ssh-listen", "off", "--net", "user", "--vmm-user", "-", "--cluster", p).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) || strings.Count(strings.TrimSpace(string(out)), "\n") > 3 {
			t.Errorf("%s: %v\n%s", tc.name, err, out)
		}
		if mounted, _ := storage.IsMountPoint(filepath.Join(state, "juicefs", "mnt")); mounted {
			t.Errorf("%s: the volume was mounted", tc.name)
		}
	}
}
