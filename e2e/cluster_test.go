package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/netns"
	"github.com/denhq/den/internal/pgtest"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/peer"
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
	// lan, when set, holds each host in a network namespace of its own
	// (lan.Hosts[hosts[name]]), and PostgreSQL and MinIO in its servers
	// namespace; else all share the test's loopback.
	lan   *netns.LAN
	hosts map[string]int
}

// newClusterEnv is a cluster whose hosts share the test's loopback.
func newClusterEnv(t testing.TB, lease time.Duration) *clusterEnv {
	return newCluster(t, lease, pgtest.Start(t), startMinio(t))
}

// newClusterLAN is a cluster of the hosts named, each in a network
// namespace of its own, as machines on a network are: its peer
// listener, SSH gateway and URLs on its own address, reaching
// PostgreSQL and MinIO at the LAN's servers address.
func newClusterLAN(t testing.TB, lease time.Duration, hosts ...string) *clusterEnv {
	requireHost(t)
	lan, err := netns.NewLAN(fmt.Sprintf("c%d", os.Getpid()%100000), hosts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lan.Close)
	c := newCluster(t, lease, pgtest.StartIn(t, lan.Servers, netns.LANAddr), startMinioIn(t, lan.Servers, netns.LANAddr+":9000"))
	c.lan, c.hosts = lan, map[string]int{}
	for i, h := range hosts {
		c.hosts[h] = i
	}
	return c
}

func newCluster(t testing.TB, lease time.Duration, pg *pgtest.Server, m *minio) *clusterEnv {
	c := &clusterEnv{t: t, pg: pg, minio: m, dir: t.TempDir(), lease: lease}
	c.pg.CreateDatabase(t, "den")
	c.pg.CreateDatabase(t, "den_volume")
	c.write("cluster-secrets.json", map[string]string{"registry_password": pgtest.Password})
	c.write("volume-secrets.json", map[string]string{"access_key": minioUser, "secret_key": minioPassword, "meta_password": pgtest.Password})
	cert, key, err := peer.NewCA("den e2e cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": cert, "ca.key": key} {
		if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
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

// clusterBucket is the MinIO bucket of a cluster's volume.
const clusterBucket = "den-cluster"

// config writes host's cluster config and returns its path: its peer
// listener on a loopback port of its own, or on its LAN address.
func (c *clusterEnv) config(host string) string {
	addr := "127.0.0.1:" + freePort(c.t)
	if c.lan != nil {
		addr = c.addr(host) + ":7443"
	}
	return c.write(host+".json", map[string]any{
		"host":         host,
		"address":      addr,
		"ca_cert":      "ca.crt",
		"ca_key":       "ca.key",
		"registry":     c.pg.TCPURL("den"),
		"secrets_file": "cluster-secrets.json",
		"volume": map[string]any{
			"meta_url":     c.pg.TCPURL("den_volume"),
			"s3":           map[string]any{"endpoint": "http://" + c.minio.addr, "bucket": clusterBucket, "create_bucket": true},
			"secrets_file": "volume-secrets.json",
		},
		"lease": c.lease.String(),
	})
}

// host starts a daemon of the cluster, with env added to its
// environment.
func (c *clusterEnv) host(name string, env ...string) *daemon {
	d := newDaemonIn(c.t, c.setup(name))
	d.env = env
	d.start()
	return d
}

// setup is the daemon setup of host name: its cluster config, and the
// unmount of the shared volume when the test ends, whatever teardown
// found. On a LAN, the daemon runs in the host's namespace, its SSH
// gateway on port 2222 of its address and its URLs on port 8080, its VMs
// on TAPs (their resolver asks the servers' address, where nothing
// answers: the test's guests resolve no name).
func (c *clusterEnv) setup(name string) func(dir string) []string {
	return func(dir string) []string {
		c.t.Cleanup(func() {
			for _, m := range []string{"mnt-ro", "mnt"} {
				_ = syscall.Unmount(filepath.Join(dir, "state", "juicefs", m), syscall.MNT_DETACH)
			}
		})
		args := []string{"--cluster", c.config(name)}
		if c.lan != nil {
			args = append(args, "--netns", c.lan.Hosts[c.hosts[name]], "--net", "tap", "--dns-upstream", netns.LANAddr+":53",
				"--ssh-listen", c.addr(name)+":2222", "--http-listen", c.addr(name)+":8080")
		}
		return args
	}
}

// addr is host's address on the LAN.
func (c *clusterEnv) addr(host string) string {
	i, ok := c.hosts[host]
	if !ok {
		c.t.Fatalf("host %s is not on the test's LAN", host)
	}
	return c.lan.Addrs[i]
}

// taps lists den's TAPs in host's network namespace.
func (c *clusterEnv) taps(t *testing.T, host string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", c.lan.Hosts[c.hosts[host]], "ip", "-o", "link", "show", "type", "tun").CombinedOutput()
	if err != nil {
		t.Fatalf("links of %s: %v: %s", host, err, out)
	}
	var taps []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], "dn") {
			taps = append(taps, strings.TrimSuffix(f[1], ":"))
		}
	}
	return taps
}

// ssh runs OpenSSH's client with key against host's gateway from the
// LAN's servers namespace (another machine of the network), and returns
// stdout, stderr and the exit status.
func (c *clusterEnv) ssh(g *gw, key, host string, args ...string) (string, string, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append(append([]string{"netns", "exec", c.lan.Servers, "ssh"}, g.opts(key)...), "-p", "2222")...)
	cmd.Args = append(cmd.Args, args...)
	return runTool(c.t, cmd, nil)
}

// get GETs url with the bearer token from the LAN's servers namespace,
// and returns the status and the body.
func (c *clusterEnv) get(url, token string) (int, string, error) {
	hc := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true, DialContext: netns.Dialer(c.lan.Servers)}}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// registrySetup is the daemon setup of a test that did not ask for one:
// none, or with DEN_E2E_REGISTRY=postgres a one-host cluster of its own
// (a real PostgreSQL and MinIO), so that the tests make test runs that
// way too exercise the PostgreSQL registry and the shared volume. Its
// lease is long: crash tests restart the daemon well within half of it.
func registrySetup(t testing.TB) daemonSetup {
	switch r := os.Getenv("DEN_E2E_REGISTRY"); r {
	case "", "sqlite":
		return daemonSetup{}
	case "postgres":
		c := newClusterEnv(t, time.Minute)
		return daemonSetup{
			args:     c.setup("e2e-host"),
			objects:  filepath.Join(c.minio.dir, clusterBucket),
			registry: func() (*registry.DB, error) { return registry.OpenPostgres(context.Background(), c.pg.DSN("den")) },
		}
	default:
		t.Fatalf("DEN_E2E_REGISTRY=%q: want sqlite or postgres", r)
		return daemonSetup{}
	}
}

// daemonSetup is how a daemon is set up (nil and "": as on a host of
// its own).
type daemonSetup struct {
	args func(dir string) []string // run on the test's directory: the daemon's extra arguments
	// objects is where the daemon's volume keeps its objects (a
	// cluster's: MinIO's directory of its bucket).
	objects string
	// registry opens the daemon's registry (a cluster's: in PostgreSQL).
	registry func() (*registry.DB, error)
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

// infoUntil waits (bounded) until d's den info of vm satisfies cond.
func (d *daemon) infoUntil(vm string, cond func(vmJSON) bool) bool {
	return eventually(2*time.Minute, func() bool {
		out, err := d.run("info", vm, "--json")
		var got vmJSON
		return err == nil && json.Unmarshal([]byte(out), &got) == nil && cond(got)
	})
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

// TestClusterFence: live hosts, each in a network namespace of its own,
// share a PostgreSQL registry and a volume in MinIO with its metadata in
// PostgreSQL, each running VMs of its own under per-VM leases. A request
// for a VM one host runs is forwarded to it from another (mutual TLS);
// put to sleep on one, the VM is woken on another by an ssh through that
// host's gateway, with its files and processes; its URL is served
// through a third host; two hosts racing to wake it start one VMM, and
// both requests are served. den move takes a VM, with its processes, to
// either host; a drained host's VMs move to the other, and creates and
// wakes through it start nothing there.
// When a host's daemon freezes (SIGSTOP), its fence guard kills its VMMs
// before its leases expire; once they lapsed past the grace, another
// host takes its VMs over (recorded lost, with that host, their disks
// cloned afresh, so that a write the frozen host's volume client commits
// late never reaches them); the one made with --on-host-loss restart is
// booted at once, the other waits for a wake. When the frozen daemon
// thaws, its renewal is refused and it exits.
// A third host with another QEMU version is refused as a move's target,
// and a wake through it is placed on a host that can restore the VM's
// memory. Killed with its VMMs (kill -9), a host's VMs are taken over by
// the third. A restart of PostgreSQL leaves the live host and its VMs
// running.
func TestClusterFence(t *testing.T) {
	// The lease leaves a restart of PostgreSQL under the load below, some
	// seconds on a loaded 2-core machine, well within the fence's L/2.
	c := newClusterLAN(t, 12*time.Second, "host-a", "host-b", "host-c")
	a := c.host("host-a")
	b := c.host("host-b")
	hc := c.host("host-c")
	h := hostsOf(t, a)
	if h.Registry != "postgres" || len(h.Hosts) != 3 || h.Hosts[0].Name != "host-a" || !h.Hosts[0].Alive || !h.Hosts[0].This ||
		h.Hosts[1].Name != "host-b" || !h.Hosts[1].Alive || h.Hosts[2].Name != "host-c" || !h.Hosts[2].Alive {
		t.Fatalf("hosts on host-a: %+v", h)
	}
	g := &gw{t: t, dir: t.TempDir()}
	key := g.key("alice")
	a.must("keys", "add", key+".pub") // for user default, who owns the VMs
	a.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	a.must("exec", "box", "--", "sh", "-c", "echo from-a > /root/mark; sync; sleep 100000 </dev/null >/dev/null 2>&1 &")
	const still = "cat /root/mark; grep -q '10000[0]' /proc/[0-9]*/cmdline 2>/dev/null && echo sleeping"
	b.must("create", "other", "--memory", "256M", "--idle-timeout", "0", "--on-host-loss", "restart")
	if n, m := len(a.vmmPIDs("box")), len(b.vmmPIDs("other")); n != 1 || m != 1 {
		t.Fatalf("VMMs: box on host-a %d, other on host-b %d", n, m)
	}
	// On TAPs, each VM has a subnet of its own in the cluster: host-b,
	// which started before box was made, passed box's by.
	_, boxIP := a.guestAddr("box")
	if _, otherIP := b.guestAddr("other"); boxIP == "" || otherIP == "" || boxIP == otherIP {
		t.Fatalf("guest addresses: box %q, other %q", boxIP, otherIP)
	}
	// A VM one host runs is reached through the other: the request is
	// forwarded to its host.
	if out := b.must("exec", "box", "--", "cat", "/root/mark"); out != "from-a\n" {
		t.Fatalf("exec on host-b of box, which host-a runs: %q", out)
	}
	if vm := b.info("box"); vm.State != "running" || vm.Host != "host-a" {
		t.Fatalf("box seen from host-b: %+v", vm)
	}
	if n := len(b.vmmPIDs("box")); n != 0 {
		t.Fatalf("host-b started %d VMMs of box", n)
	}

	// Put to sleep on host-a, box is woken by an ssh through host-b's
	// gateway, from another machine of the network: it runs on host-b,
	// with its file and the process it left running.
	a.must("sleep", "box")
	if out, errs, code := c.ssh(g, key, "host-b", "box@"+c.addr("host-b"), still); out != "from-a\nsleeping\n" || code != 0 {
		t.Fatalf("ssh box@host-b: %q %q %d", out, errs, code)
	}
	if n, m := len(a.vmmPIDs("box")), len(b.vmmPIDs("box")); n != 0 || m != 1 {
		t.Fatalf("VMMs of box after its wake through host-b's gateway: host-a %d, host-b %d", n, m)
	}
	// host-b read box's memory from host-a's local copy of it, checking
	// it against the digests on the volume.
	if log, _ := os.ReadFile(b.logPath); !bytes.Contains(log, []byte(`msg="den: memory read from the host that put the vm to sleep" vm=box host=host-a`)) {
		t.Fatal("box's wake on host-b did not read host-a's local copy of its memory (no such line in its log)")
	}
	if _, ip := b.guestAddr("box"); ip != boxIP {
		t.Fatalf("box's address on host-b: %q, on host-a %q", ip, boxIP)
	}
	// box's URL is served through host-c, from host-b, which runs it.
	b.must("exec", "box", "--", "sh", "-c", "mkdir -p /tmp/www && echo hi from box > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	var u struct{ Token string }
	if err := json.Unmarshal([]byte(hc.must("url", "box", "--json")), &u); err != nil || u.Token == "" {
		t.Fatalf("den url box on host-c: %v %+v", err, u)
	}
	if code, body, err := c.get("http://"+c.addr("host-c")+":8080/vm/box/", u.Token); err != nil || code != 200 || body != "hi from box\n" {
		t.Fatalf("box's URL through host-c: %d %q %v", code, body, err)
	}
	if n, m := len(b.vmmPIDs("box")), len(hc.vmmPIDs("box")); n != 1 || m != 0 {
		t.Fatalf("VMMs of box after its URL was served through host-c: host-b %d, host-c %d", n, m)
	}
	// PostgreSQL restarts while each host creates, sleeps and wakes a VM,
	// and box and other run on host-b, writing their disks: a write
	// JuiceFS commits while PostgreSQL is away waits for it.
	for _, vm := range []string{"box", "other"} {
		churn(b, vm)
	}
	db := c.registry()
	load := map[*daemon][][]string{}
	for _, d := range []*daemon{a, b, hc} {
		vm := "load-" + hostOf(t, d)
		load[d] = [][]string{{"create", vm, "--memory", "128M", "--idle-timeout", "0"}, {"sleep", vm}, {"exec", vm, "--", "true"}}
	}
	underRestart(t, c, load)
	for _, h := range []string{"host-a", "host-b", "host-c"} {
		_, _ = a.run("rm", "--force", "load-"+h) // a create that failed left none
	}
	if out := a.must("ls"); strings.Contains(out, "load-") {
		t.Fatalf("den ls after the load VMs were removed:\n%s", out)
	}
	for _, vm := range []string{"box", "other"} {
		churned(t, b, vm)
		b.must("sleep", vm) // its disk flushes
		b.must("exec", vm, "--", "true")
	}
	if n, m := len(b.vmmPIDs("box")), len(b.vmmPIDs("other")); n != 1 || m != 1 {
		t.Fatalf("VMMs on host-b after PostgreSQL restarted: box %d, other %d", n, m)
	}

	// host-c stops (it comes back below with another QEMU): a stop with
	// no VM of its own.
	if err := hc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	hc.waitExit()

	// Both hosts race to wake box, 20 times: one VMM each time, and the
	// request that lost the race is served through the host that won it.
	races := time.Now()
	won := map[string]int{}
	for round := range 20 {
		a.must("sleep", "box") // forwarded to the host that runs it
		outs := make(chan string, 2)
		for _, d := range []*daemon{a, b} {
			go func() {
				_, err := d.run("exec", "box", "--", "true")
				if err != nil {
					outs <- "failed: " + err.Error()
					return
				}
				outs <- ""
			}()
		}
		for range 2 {
			if out := <-outs; out != "" {
				t.Fatalf("round %d: a wake: %s", round, out)
			}
		}
		n, m := len(a.vmmPIDs("box")), len(b.vmmPIDs("box"))
		if n+m != 1 {
			t.Fatalf("round %d: VMMs of box: host-a %d, host-b %d", round, n, m)
		}
		won[map[bool]string{true: "host-a", false: "host-b"}[n == 1]]++
	}
	t.Logf("20 rounds of racing wakes in %s, won by %v", time.Since(races).Round(time.Second), won)
	// den move, asked of either host, goes through the host that runs
	// the VM: box ends on each host in turn, with its file and a
	// process it left running.
	moves := []string{"host-a", "host-b"} // ending on host-b
	if len(a.vmmPIDs("box")) == 1 {
		moves = []string{"host-b", "host-a", "host-b"}
	}
	for _, to := range moves {
		var res struct {
			From, To string
			VM       vmJSON
		}
		if err := json.Unmarshal([]byte(a.must("move", "box", "--to", to, "--json")), &res); err != nil {
			t.Fatal(err)
		}
		if res.To != to || res.VM.State != "running" || res.VM.Host != to {
			t.Fatalf("den move box --to %s: %+v", to, res)
		}
		here, there := a, b
		if to == "host-b" {
			here, there = b, a
		}
		if n, m := len(here.vmmPIDs("box")), len(there.vmmPIDs("box")); n != 1 || m != 0 {
			t.Fatalf("VMMs of box after its move to %s: there %d, elsewhere %d", to, n, m)
		}
		if out := here.must("exec", "box", "--", "sh", "-c", still); out != "from-a\nsleeping\n" {
			t.Fatalf("box moved to %s: %q", to, out)
		}
	}

	// host-b drains, asked through host-a: its VMs move to host-a, and
	// what reaches host-b afterwards starts nothing there.
	var drained struct {
		Draining bool
		Moved    []struct{ To string }
		Failed   []struct{ VM, Error string }
	}
	out, err := a.run("hosts", "drain", "host-b", "--json")
	if err != nil {
		t.Fatalf("den hosts drain host-b: %v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &drained); err != nil {
		t.Fatal(err)
	}
	if !drained.Draining || len(drained.Moved) != 2 || len(drained.Failed) != 0 {
		t.Fatalf("den hosts drain host-b: %+v", drained)
	}
	if n, m := len(a.vmmPIDs("box"))+len(a.vmmPIDs("other")), len(b.vmmPIDs("box"))+len(b.vmmPIDs("other")); n != 2 || m != 0 {
		t.Fatalf("VMMs after host-b drained: host-a %d, host-b %d", n, m)
	}
	b.must("create", "third", "--memory", "256M", "--idle-timeout", "0")
	if n, m := len(a.vmmPIDs("third")), len(b.vmmPIDs("third")); n != 1 || m != 0 {
		t.Fatalf("a create through draining host-b: VMMs host-a %d, host-b %d", n, m)
	}
	b.must("sleep", "third")
	if out := b.must("exec", "third", "--", "echo", "hi"); out != "hi\n" || len(a.vmmPIDs("third")) != 1 {
		t.Fatalf("a wake through draining host-b: %q, VMMs on host-a %d", out, len(a.vmmPIDs("third")))
	}
	b.must("rm", "--force", "third")
	b.must("hosts", "drain", "host-b", "--undo")
	for _, name := range []string{"box", "other"} {
		b.must("move", name, "--to", "host-b")
	}

	// host-b's daemon freezes: its fence guard kills its VMMs while its
	// leases are still held.
	if err := syscall.Kill(b.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = syscall.Kill(b.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()
	if !eventually(time.Minute, func() bool { return len(b.vmmPIDs("box")) == 0 && len(b.vmmPIDs("other")) == 0 }) {
		t.Fatal("the fence did not stop host-b's VMMs while its daemon was frozen")
	}
	l, err := db.GetLease(context.Background(), "box")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Held() || l.Host != "host-b" {
		t.Fatalf("host-b's VMM was stopped only after its lease lapsed (or the lease moved): %+v", l)
	}
	t.Logf("the fence stopped host-b's VMMs %s before their leases expired", l.Expires.Sub(l.Now))
	// A write host-b's volume client commits late, through a file it
	// had open, must never reach the disk host-a boots.
	late, err := os.OpenFile(filepath.Join(b.volumeMount(), string(storage.VMDisk("box"))), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	st, err := late.Stat()
	if err != nil {
		t.Fatal(err)
	}
	lateAt := st.Size() - 4096

	// host-a takes box and other over once their leases lapsed past the
	// grace, by itself: box waits for a person, other (--on-host-loss
	// restart) is booted on host-a.
	// (A read forwarded to host-b meanwhile fails once host-b's lease
	// lapsed, without waiting for it.)
	if !a.infoUntil("box", func(vm vmJSON) bool {
		return vm.State == "lost" &&
			strings.Contains(vm.Reason, "lost with host host-b") && strings.Contains(vm.Reason, "its disk was cloned afresh")
	}) {
		t.Fatalf("box on host-a after host-b froze: %+v", a.info("box"))
	}
	if !a.infoUntil("other", func(vm vmJSON) bool {
		return vm.State == "running" && vm.Host == "host-a"
	}) {
		t.Fatalf("other (on host loss: restart) on host-a after host-b froze: %+v", a.info("other"))
	}
	if n := len(a.vmmPIDs("other")); n != 1 {
		t.Fatalf("%d VMMs of other on host-a", n)
	}
	mark := []byte("late write from host-b")
	if _, err := late.WriteAt(mark, lateAt); err != nil {
		t.Fatal(err)
	}
	if err := late.Sync(); err != nil {
		// JuiceFS may refuse to commit it (the file is no longer linked).
		t.Logf("host-b's client did not commit the late write: %v", err)
	}
	got := make([]byte, len(mark))
	onA, err := os.Open(filepath.Join(a.volumeMount(), string(storage.VMDisk("box"))))
	if err != nil {
		t.Fatal(err)
	}
	_, err = onA.ReadAt(got, lateAt)
	onA.Close()
	if err != nil || bytes.Equal(got, mark) {
		t.Fatalf("host-a's disk of box holds host-b's late write (%q, %v)", got, err)
	}
	h = hostsOf(t, a)
	if len(h.Hosts) != 3 || !h.Hosts[0].Alive || h.Hosts[1].Alive || h.Hosts[2].Alive {
		t.Fatalf("hosts on host-a: %+v", h)
	}
	// Lost, box waits for a person: an exec does not start it, a wake
	// boots it from its disk.
	if _, err := a.run("exec", "box", "--", "true"); err == nil || !strings.Contains(err.Error(), "den wake box boots it from its disk") {
		t.Fatalf("exec on lost box: %v", err)
	}
	if n := len(a.vmmPIDs("box")); n != 0 {
		t.Fatalf("an exec started lost box: %d VMMs", n)
	}
	a.must("wake", "box")
	if out := a.must("exec", "box", "--", "cat", "/root/mark"); out != "from-a\n" {
		t.Fatalf("box booted on host-a: /root/mark %q", out)
	}
	if n := len(a.vmmPIDs("box")); n != 1 {
		t.Fatalf("%d VMMs of box on host-a", n)
	}

	// host-b thaws: its renewal is refused and it exits; its VMMs stay
	// stopped.
	if err := syscall.Kill(b.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed = true
	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatal("host-b's daemon exited cleanly after losing its lease")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("host-b's daemon kept running after losing its lease")
	}
	log, _ := os.ReadFile(b.logPath)
	if !strings.Contains(string(log), "lost its host lease") {
		t.Fatalf("host-b's log does not say it lost its lease:\n%s", log)
	}
	if n := len(b.vmmPIDs("box")) + len(b.vmmPIDs("other")); n != 0 {
		t.Fatalf("host-b runs %d VMMs after thawing", n)
	}
	if vm := a.info("box"); vm.State != "running" {
		t.Fatalf("box on host-a after host-b thawed: %+v", vm)
	}

	// host-c runs another version of QEMU (its binary's --version says
	// 9.1.0), which does not read box's memory: a move there is refused
	// before box sleeps, and a wake through host-c runs box on host-a,
	// which can restore it.
	// (The script is where the VMMs' user can run it: host-c boots a VM
	// through it below.)
	real, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	qemuDir, err := os.MkdirTemp("/tmp", "den-e2e-qemu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(qemuDir) })
	qemu := filepath.Join(qemuDir, "qemu-9.1")
	script := "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'QEMU emulator version 9.1.0'; exit 0; }\nexec " + real + " \"$@\"\n"
	if err := os.Chmod(qemuDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	hc.env = []string{"DEN_QEMU_BINARY=" + qemu}
	hc.start()
	// host-c runs none of the cluster's VMs: it put none on its network
	// at its start.
	if taps := c.taps(t, "host-c"); len(taps) != 0 {
		t.Fatalf("TAPs on host-c, which runs no VM: %v", taps)
	}
	_, err = a.run("move", "box", "--to", "host-c")
	var refused *runError
	if !errors.As(err, &refused) || !strings.Contains(refused.stderr, `host host-c cannot restore vm "box"'s memory`) ||
		!strings.Contains(refused.stderr, "on host host-c does not read that version's snapshots") || strings.Contains(refused.stderr, "\n") {
		t.Fatalf("den move box --to host-c (another qemu): %v", err)
	}
	if vm := a.info("box"); vm.State != "running" || vm.Host != "host-a" {
		t.Fatalf("box after a move refused: %+v", vm)
	}
	a.must("sleep", "box")
	if out := hc.must("exec", "box", "--", "cat", "/root/mark"); out != "from-a\n" {
		t.Fatalf("box woken through host-c: /root/mark %q", out)
	}
	if n, m := len(a.vmmPIDs("box")), len(hc.vmmPIDs("box")); n != 1 || m != 0 {
		t.Fatalf("VMMs of box woken through host-c: host-a %d, host-c %d", n, m)
	}

	// host-a dies as a power cut would: kill -9 of its daemon, its fence
	// guard and its VMMs. host-c sees it lost after its lease: box is
	// lost with it, and other (--on-host-loss restart) boots on host-c.
	a.kill()
	killUnder(a.state)
	if !hc.infoUntil("box", func(vm vmJSON) bool {
		return vm.State == "lost" && strings.Contains(vm.Reason, "lost with host host-a")
	}) {
		t.Fatalf("box on host-c after host-a was killed: %+v", hc.info("box"))
	}
	if !hc.infoUntil("other", func(vm vmJSON) bool {
		return vm.State == "running" && vm.Host == "host-c"
	}) {
		t.Fatalf("other (on host loss: restart) on host-c after host-a was killed: %+v", hc.info("other"))
	}
	if n, m := len(hc.vmmPIDs("other")), len(hc.vmmPIDs("box")); n != 1 || m != 0 {
		t.Fatalf("VMMs on host-c after host-a was killed: other %d, box %d", n, m)
	}
	if h := hostsOf(t, hc); len(h.Hosts) != 3 || h.Hosts[0].Alive || h.Hosts[1].Alive || !h.Hosts[2].Alive {
		t.Fatalf("hosts on host-c: %+v", h)
	}

	// PostgreSQL restarts under host-c while other writes its disk: the
	// host's renewals retry within the fence's deadline, and its VM goes
	// on, its disk too.
	vmms := hc.vmmPIDs("other")
	churn(hc, "other")
	retried, err := testutil.JuiceFSRetries(hc.volumeMount())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.pg.Restart(); err != nil {
		t.Fatal(err)
	}
	churned(t, hc, "other")
	now, err := testutil.JuiceFSRetries(hc.volumeMount())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("host-c's volume ran %.0f metadata transactions again across PostgreSQL's restart", now-retried)
	if got := hc.vmmPIDs("other"); !slices.Equal(got, vmms) {
		t.Fatalf("other's VMM after PostgreSQL restarted: %v, was %v", got, vmms)
	}
	if h := hostsOf(t, hc); !h.Hosts[2].Alive {
		t.Fatalf("hosts after PostgreSQL restarted: %+v", h)
	}
	hc.must("sleep", "other") // its disk flushes
	if out := hc.must("exec", "other", "--", "sh", "-c", "dd if=/dev/zero of=/var/tmp/after bs=64k count=4 conv=fsync 2>/dev/null && echo written"); out != "written\n" {
		t.Fatalf("a disk write in other after its sleep across PostgreSQL's restart: %q", out)
	}
}

// churn starts a loop in vm's guest that writes its disk, each write
// flushed (dd conv=fsync), until churned stops it; the guest's kernel log
// starts afresh.
func churn(d *daemon, vm string) {
	d.must("exec", vm, "--", "sh", "-c", "rm -f /var/tmp/churn.stop /var/tmp/churn.stopped /var/tmp/churn.err; dmesg -c >/dev/null; "+
		"(while [ ! -e /var/tmp/churn.stop ]; do dd if=/dev/urandom of=/var/tmp/churn bs=64k count=16 conv=fsync 2>/dev/null || echo failed >>/var/tmp/churn.err; done; "+
		"echo stopped >/var/tmp/churn.stopped) </dev/null >/dev/null 2>&1 &")
}

// churned stops churn's loop in vm's guest, and fails the test if a write
// or flush of the loop failed or the guest's kernel saw an I/O error.
func churned(t *testing.T, d *daemon, vm string) {
	t.Helper()
	d.must("exec", vm, "--", "touch", "/var/tmp/churn.stop")
	if !eventually(time.Minute, func() bool {
		_, err := d.run("exec", vm, "--", "test", "-e", "/var/tmp/churn.stopped")
		return err == nil
	}) {
		t.Fatalf("the disk writer in %s did not stop", vm)
	}
	out := d.must("exec", vm, "--", "sh", "-c", "cat /var/tmp/churn.err 2>/dev/null; dmesg | grep -i 'i/o error'; true")
	if out != "" {
		t.Fatalf("disk writes in %s across PostgreSQL's restart:\n%s", vm, out)
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

// underRestart runs each host's verbs in turn, the hosts side by side,
// and restarts PostgreSQL meanwhile. Each verb finishes, or fails with a
// one-line error; afterwards every host is alive, no VM is lost, and a
// running VM has one VMM, on the host that den info says runs it.
func underRestart(t *testing.T, c *clusterEnv, load map[*daemon][][]string) {
	t.Helper()
	type done struct {
		err        error
		start, end time.Time
	}
	dones := make(chan done, 16)
	n := 0
	for d, verbs := range load {
		n += len(verbs)
		go func() {
			for _, args := range verbs {
				start := time.Now()
				_, err := d.run(args...)
				dones <- done{err, start, time.Now()}
			}
		}()
	}
	// The creates boot for seconds: PostgreSQL restarts while they and
	// the others are under way.
	down := time.Now()
	if err := c.pg.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	across := 0
	for range n {
		d := <-dones
		if d.start.Before(up) && d.end.After(down) {
			across++
		}
		err := d.err
		var re *runError
		switch {
		case err == nil:
		case !errors.As(err, &re) || re.stderr == "" || strings.Contains(re.stderr, "\n"):
			t.Fatalf("under a PostgreSQL restart: %v", err)
		default:
			t.Logf("under a PostgreSQL restart: %v", err)
		}
	}
	t.Logf("PostgreSQL restarted in %s; %d of %d verbs were under way meanwhile", up.Sub(down).Round(time.Millisecond), across, n)
	if across == 0 {
		t.Fatal("no verb ran across PostgreSQL's restart")
	}
	var hosts []*daemon
	names := map[*daemon]string{}
	for d := range load {
		hosts = append(hosts, d)
		names[d] = hostOf(t, d)
	}
	for _, d := range hosts {
		for _, h := range hostsOf(t, d).Hosts {
			if !h.Alive {
				t.Fatalf("host %s seen dead from a host after PostgreSQL restarted", h.Name)
			}
		}
	}
	var vms []vmJSON
	if err := json.Unmarshal([]byte(hosts[0].must("ls", "--json")), &vms); err != nil {
		t.Fatal(err)
	}
	for _, vm := range vms {
		vm := hosts[0].info(vm.Name)
		vmms := map[string]int{}
		total := 0
		for _, d := range hosts {
			if k := len(d.vmmPIDs(vm.Name)); k > 0 {
				vmms[names[d]] += k
				total += k
			}
		}
		switch {
		case vm.State == "sleeping" && total == 0:
		case vm.State == "running" && total == 1 && vmms[vm.Host] == 1:
		default:
			t.Fatalf("vm %s after PostgreSQL restarted: %+v; VMMs by host %v", vm.Name, vm, vmms)
		}
	}
}

// hostOf is the name of d's host.
func hostOf(t *testing.T, d *daemon) string {
	t.Helper()
	for _, h := range hostsOf(t, d).Hosts {
		if h.This {
			return h.Name
		}
	}
	t.Fatal("den hosts names no host as this one")
	return ""
}
