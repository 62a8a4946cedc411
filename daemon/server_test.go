//go:build linux

package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/machine/machinetest"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/secrets"
	"github.com/denhq/den/users"
	"github.com/denhq/den/vmm"
)

// testTimeout bounds every test's operations.
const testTimeout = 60 * time.Second

// imageSize is the fake image's root disk, the least a VM's disk can be.
const imageSize = 8 << 20

// apiEnv is the API server on a Manager over a fake VMM and a directory
// volume, served on a unix socket as the daemon serves it.
type apiEnv struct {
	t      *testing.T
	m      *machine.Manager
	drv    *machinetest.Driver
	state  machine.StateDir
	socket string
	client *api.Client // the Go client
	http   *http.Client
	srv    *Server
	inproc *inProcess // connections as any caller (asCaller)
	tlsLn  *apiListener
}

func newAPIEnv(t *testing.T) *apiEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "den-api-") // short: a unix socket lives in it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	images := image.Dir(filepath.Join(dir, "images"))
	if err := os.MkdirAll(images.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	man := image.Manifest{Format: 1, Artifacts: []image.Artifact{{Name: image.Minimal, Kind: "rootfs", Key: "0123456789abcdef0123"}}}
	data, _ := json.Marshal(man)
	if err := os.WriteFile(images.ManifestPath(), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{images.BzImage(), images.Vmlinux(), images.Initramfs()} {
		// Imported onto the volume by content at each create: a fake
		// VMM boots nothing from them.
		if err := os.WriteFile(f, []byte("fake "+filepath.Base(f)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(images.RootDisk(image.Minimal), []byte("fake ext4"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(images.RootDisk(image.Minimal), imageSize); err != nil {
		t.Fatal(err)
	}
	vol, err := machinetest.NewVolume(filepath.Join(dir, "volume"))
	if err != nil {
		t.Fatal(err)
	}
	state := machine.StateDir(filepath.Join(dir, "state"))
	if err := os.MkdirAll(state.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := registry.Open(state.DB())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	drv := machinetest.NewDriver()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	m, err := machine.New(ctx, machine.Config{
		State: state, Volume: vol, Registry: db, Images: images, DefaultImage: image.Minimal, VMM: machinetest.Name,
		Drivers:     map[string]vmm.Driver{machinetest.Name: drv},
		BootTimeout: 20 * time.Second, LockWait: 20 * time.Second, DrainTimeout: 20 * time.Second, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	hostKey, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "den.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(m, users.Keys{Store: db}, api.DaemonInfo{VMM: machinetest.Name}, hostKey, log)
	s.tokens = users.Tokens{Store: db}
	s.bearer = tokenCaller(s.tokens)
	beat, err := startHeart(ctx, db, DefaultLease, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(beat.close)
	if err := beat.attach(ctx, m, hostSelf("test-host", "", "dev", m.Host())); err != nil {
		t.Fatal(err)
	}
	s.hosts = &hostsView{store: db, backend: db.Backend(), self: "test-host", lease: DefaultLease}
	if s.audit, err = audit.Open(state.Audit(), audit.Options{}); err != nil {
		t.Fatal(err)
	}
	if s.secrets, err = secrets.Open(state.Secrets(), state.SecretsKey()); err != nil {
		t.Fatal(err)
	}
	limited := NewHTTPServer(checkOpenAPI(t, s), nil, log)
	srv := limited.Server
	tlsLn, err := listenAPI(Options{APIListen: "127.0.0.1:0"}, state, limited)
	if err != nil {
		t.Fatal(err)
	}
	inproc := newInProcess()
	s.inproc = inproc
	go func() { _ = srv.Serve(ln) }()
	go func() { _ = srv.Serve(inproc) }()
	go func() { _ = srv.Serve(tlsLn.ln) }()
	t.Cleanup(func() { srv.Close(); inproc.Close(); s.audit.Close() })
	e := &apiEnv{t: t, m: m, drv: drv, state: state, socket: socket, client: api.NewClient(socket), srv: s, inproc: inproc, tlsLn: tlsLn}
	e.http = &http.Client{Timeout: testTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	return e
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// create makes a running VM through the Go client.
func (e *apiEnv) create(name string) api.VM {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	vm, err := e.client.CreateVM(ctx, api.CreateRequest{Name: name, MemoryBytes: 128 << 20, DiskBytes: imageSize,
		IdleTimeout: "0", Cold: true}, nil)
	if err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	return vm
}

// do sends a raw request and returns the answer, its body read.
func (e *apiEnv) do(method, path string, body []byte) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, "http://den"+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return resp, data
}

// vmNames lists the VMs on record.
func (e *apiEnv) vmNames() []string {
	e.t.Helper()
	vms, err := e.client.ListVMs(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, vm := range vms {
		names = append(names, vm.Name)
	}
	return names
}

// TestRefusedBeforeWork: requests that are wrong before any work is done
// (a bad name or size, an unknown VM or checkpoint, an unknown field,
// trailing garbage, a body too large, a name taken) answer with their 4xx
// status and a JSON error, also on the streaming endpoints, and change
// nothing: no VM record, no checkpoint, no boot, no write of the VM that
// is there.
func TestRefusedBeforeWork(t *testing.T) {
	e := newAPIEnv(t)
	e.create("box")
	before, err := e.m.Record(context.Background(), "box")
	if err != nil {
		t.Fatal(err)
	}
	boots := e.drv.Boots()
	huge := []byte(`{"name":"big","image":"` + strings.Repeat("x", 2<<20) + `"}`)
	cases := []struct {
		method, path, body string
		status             int
		code, want         string
	}{
		{"POST", "/v1/vms", `{"name":"Bad_Name"}`, 400, "invalid", `bad vm name "Bad_Name"`},
		{"POST", "/v1/vms", `{"name":"x","memory_mib":2048}`, 400, "invalid", `bad request body: unknown field "memory_mib"`},
		{"POST", "/v1/vms", `{"name":"x","disk_bytes":1}`, 400, "invalid", `bad disk size 1 bytes`},
		{"POST", "/v1/vms", `{"name":"x","memory_bytes":1}`, 400, "invalid", `bad memory size 1 bytes`},
		{"POST", "/v1/vms", `{"name":"x","memory_bytes":-536870912}`, 400, "invalid", `bad memory size -536870912 bytes`},
		{"POST", "/v1/vms", `{"name":"x","memory_bytes":67108864}`, 400, "invalid", `memory 64M is too small`},
		{"POST", "/v1/vms", `{"name":"x","disk_bytes":1048576}`, 400, "invalid", `smaller than image minimal's disk: at least 8M`},
		{"POST", "/v1/vms", `{"name":"x","cpus":-1}`, 400, "invalid", `bad cpus -1`},
		{"POST", "/v1/vms", `{"name":"x","memory_bytes":"512M"}`, 400, "invalid", `field "memory_bytes" must be a whole number, not string`},
		{"POST", "/v1/vms", `{"name":"x","idle_timeout":"5"}`, 400, "invalid", `bad idle timeout "5"`},
		{"POST", "/v1/vms", `{"name":"x"} {"name":"y"}`, 400, "invalid", `more after the JSON object`},
		{"POST", "/v1/vms", `{"name":"x"}garbage`, 400, "invalid", `more after the JSON object`},
		{"POST", "/v1/vms", `{"name":"x"`, 400, "invalid", `bad request body`},
		{"POST", "/v1/vms", `["x"]`, 400, "invalid", `want a JSON object`},
		{"POST", "/v1/vms", string(huge), 413, "invalid", `request body too large`},
		{"POST", "/v1/vms", `{"name":"x","image":"nonesuch"}`, 404, "not_found", `no image named "nonesuch"`},
		{"POST", "/v1/vms", `{"name":"box"}`, 409, "exists", `exists`},
		{"GET", "/v1/vms/ghost", ``, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/ghost/restore", `{"checkpoint":"cp-1"}`, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/restore", `{"checkpoint":"cp-9"}`, 404, "not_found", `has no checkpoint cp-9`},
		{"POST", "/v1/vms/box/restore", `{"checkpoint":"../x"}`, 400, "invalid", ``},
		{"POST", "/v1/vms/box/restore", `{"checkpoint":"cp-1","no_sav":true}`, 400, "invalid", `unknown field "no_sav"`},
		{"POST", "/v1/vms/ghost/fork", `{"name":"y"}`, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/fork", `{"name":"Y"}`, 400, "invalid", `bad vm name "Y"`},
		{"POST", "/v1/vms/box/fork", `{"name":"y","checkpoint":"cp-9"}`, 404, "not_found", `has no checkpoint cp-9`},
		{"POST", "/v1/vms/box/fork", `{"name":"box"}`, 409, "exists", `exists`},
		{"POST", "/v1/vms/ghost/checkpoints", `{}`, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/checkpoints", `{"comment":"x","kep":2}`, 400, "invalid", `unknown field "kep"`},
		{"POST", "/v1/vms/box/sleep", `{"forse":true}`, 400, "invalid", `unknown field "forse"`},
		{"POST", "/v1/vms/ghost/sleep", `{}`, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/wake", `{"x":1}`, 400, "invalid", `unknown field "x"`},
		{"POST", "/v1/vms/ghost/wake", ``, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/resize", `{"disk_bytes":1}`, 400, "invalid", `bad disk size 1 bytes`},
		{"POST", "/v1/vms/box/resize", `{"disk_bytes":-8388608}`, 400, "invalid", `bad disk size -8388608 bytes`},
		{"POST", "/v1/vms/box/resize", `{"disk_bytes":1048576}`, 400, "invalid", `disks only grow`},
		{"POST", "/v1/vms/box/resize", `{"disk_byte":16777216}`, 400, "invalid", `unknown field "disk_byte"`},
		{"DELETE", "/v1/vms/box?force=yes", ``, 400, "invalid", `bad query ?force=yes`},
		{"DELETE", "/v1/vms/box/checkpoints/cp-9", ``, 404, "not_found", `no checkpoint cp-9`},
		{"POST", "/v1/keys", `{"public_key":"x","usr":"a"}`, 400, "invalid", `unknown field "usr"`},
	}
	for _, c := range cases {
		body := c.body
		if len(body) > 80 {
			body = body[:80] + "..."
		}
		resp, data := e.do(c.method, c.path, []byte(c.body))
		var eb api.ErrorBody
		if err := json.Unmarshal(data, &eb); err != nil || resp.StatusCode != c.status || eb.Code != c.code ||
			eb.Error == "" || !strings.Contains(eb.Error, c.want) || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s %s: %s (%s) %s\nwant %d, code %s, an error with %q", c.method, c.path, body,
				resp.Status, resp.Header.Get("Content-Type"), bytes.TrimSpace(data), c.status, c.code, c.want)
		}
	}
	if names := e.vmNames(); len(names) != 1 || names[0] != "box" {
		t.Errorf("vms after the refused requests: %v, want [box]", names)
	}
	cps, _, err := e.m.Checkpoints(context.Background(), "box")
	if err != nil || len(cps) != 0 {
		t.Errorf("checkpoints after the refused requests: %v %v", cps, err)
	}
	after, err := e.m.Record(context.Background(), "box")
	if err != nil {
		t.Fatal(err)
	}
	if after.Generation != before.Generation || after.State != registry.StateRunning || after.DiskBytes != before.DiskBytes {
		t.Errorf("box changed: %+v, was %+v", after, before)
	}
	if n := e.drv.Boots(); n != boots {
		t.Errorf("%d boots during the refused requests", n-boots)
	}
}

// TestStreamFormat: a stream is progress lines, then one final line
// marked done that carries the result; an empty body is {} (every
// default).
func TestStreamFormat(t *testing.T) {
	e := newAPIEnv(t)
	e.create("box")
	resp, data := e.do("POST", "/v1/vms/box/checkpoints", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("checkpoint: %s (%s) %s", resp.Status, resp.Header.Get("Content-Type"), data)
	}
	evs := events(t, data)
	last := evs[len(evs)-1]
	if !last.Done || last.Checkpoint == nil || last.Checkpoint.ID != "cp-1" || last.Error != "" {
		t.Fatalf("final line %+v", last)
	}
	for _, ev := range evs[:len(evs)-1] {
		if ev.Done || ev.Progress == "" {
			t.Fatalf("a line before the final one: %+v", ev)
		}
	}
}

// TestStreamEndsWithError: an operation that fails after its progress
// began ends its stream with a final line carrying the error and its
// code, and the Go client returns that error.
func TestStreamEndsWithError(t *testing.T) {
	e := newAPIEnv(t)
	// The VMM of "late" dies as it boots: after the disk is cloned.
	e.drv.Hook = func(op, rd string) {
		if op == "boot" && strings.HasSuffix(rd, "/late") {
			if v := e.drv.VM(e.state.Run("late")); v != nil {
				v.Kill()
			}
		}
	}
	body := `{"name":"late","memory_bytes":134217728,"disk_bytes":8388608,"cold":true}`
	resp, data := e.do("POST", "/v1/vms", []byte(body))
	if resp.StatusCode != 200 {
		t.Fatalf("create: %s %s, want a stream", resp.Status, data)
	}
	evs := events(t, data)
	last := evs[len(evs)-1]
	if len(evs) < 2 || evs[0].Progress == "" {
		t.Fatalf("stream %s: want progress first", data)
	}
	if !last.Done || last.Error == "" || last.Code != "internal" || last.VM != nil {
		t.Fatalf("final line %+v, want done with the error", last)
	}

	var progress []string
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := e.client.CreateVM(ctx, api.CreateRequest{Name: "late", MemoryBytes: 128 << 20, DiskBytes: imageSize, Cold: true},
		func(ev api.Event) { progress = append(progress, ev.Progress) })
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != "internal" || ae.Status != 500 || !strings.Contains(ae.Message, `create vm "late"`) {
		t.Fatalf("client: %#v, want the stream's error", err)
	}
	if len(progress) == 0 {
		t.Fatal("client: no progress before the error")
	}
	if names := e.vmNames(); len(names) != 0 {
		t.Fatalf("vms after failed creates: %v", names)
	}
}

// events parses a stream.
func events(t *testing.T, data []byte) []api.Event {
	t.Helper()
	var evs []api.Event
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		t.Fatal("an empty stream")
	}
	return evs
}

// TestHostsList: the daemon records itself with what it holds, and
// lists itself alive, marked as the host that answered.
func TestHostsList(t *testing.T) {
	e := newAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := e.client.CreateVM(ctx, api.CreateRequest{Name: "h1", MemoryBytes: 128 << 20, DiskBytes: imageSize, IdleTimeout: "0", Cold: true}, nil); err != nil {
		t.Fatal(err)
	}
	// The record counts the VM from the next heartbeat on.
	if err := e.srv.hosts.store.Heartbeat(ctx, registry.Host{Name: "other-host", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var h api.Host
	if !poll.Until(testTimeout, func() bool {
		l, err := e.client.Hosts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Hosts) != 2 || l.Registry != "sqlite" || l.LeaseMS != DefaultLease.Milliseconds() {
			t.Fatalf("hosts: %+v", l)
		}
		h = l.Hosts[1]
		if h.Name != "test-host" || !h.This || !h.Alive || h.VMM != machinetest.Name || h.CPUs < 1 || h.Version != "dev" {
			t.Fatalf("this host: %+v", h)
		}
		if l.Hosts[0].This {
			t.Fatalf("another host marked as this one: %+v", l.Hosts[0])
		}
		return h.Running == 1
	}) {
		t.Fatalf("the host record never counted the running vm: %+v", h)
	}
}
