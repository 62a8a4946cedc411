package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/api"
)

// httpClient talks HTTP to the daemon's socket, as any client may.
func (d *daemon) httpClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "unix", d.socket)
		},
	}}
}

// request sends a raw request to the daemon and returns its answer with
// the body read.
func (d *daemon) request(method, path string, body []byte) (*http.Response, []byte) {
	d.t.Helper()
	req, err := http.NewRequest(method, "http://den"+path, bytes.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.httpClient().Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return resp, data
}

// vmNames lists the daemon's VMs.
func (d *daemon) vmNames() []string {
	d.t.Helper()
	var vms []api.VM
	if err := json.Unmarshal([]byte(d.must("ls", "--json")), &vms); err != nil {
		d.t.Fatal(err)
	}
	var names []string
	for _, vm := range vms {
		names = append(names, vm.Name)
	}
	return names
}

// TestAPIStatusCodes: through the daemon's real socket, requests that
// are wrong before any work is done answer with their 4xx status and a
// JSON error, on the streaming endpoints too, and make nothing.
func TestAPIStatusCodes(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	gen := d.apiVM("box").Generation
	cases := []struct {
		method, path, body string
		status             int
		code, want         string
	}{
		{"POST", "/v1/vms", `{"name":"Bad_Name"}`, 400, "invalid", `bad vm name "Bad_Name"`},
		{"POST", "/v1/vms", `{"name":"x","memory_mib":2048}`, 400, "invalid", `unknown field "memory_mib"`},
		{"POST", "/v1/vms", `{"name":"x","disk_bytes":1}`, 400, "invalid", `bad disk size 1 bytes`},
		{"POST", "/v1/vms", `{"name":"x","disk_bytes":134217728}`, 400, "invalid", `smaller than image minimal's disk`},
		{"POST", "/v1/vms", `{"name":"x","memory_bytes":-1}`, 400, "invalid", `bad memory size -1 bytes`},
		{"POST", "/v1/vms", `{"name":"x"}{"name":"y"}`, 400, "invalid", `more after the JSON object`},
		{"POST", "/v1/vms", `{"name":"x","image":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "invalid", `request body too large`},
		{"POST", "/v1/vms", `{"name":"box"}`, 409, "exists", `exists`},
		{"POST", "/v1/vms/ghost/restore", `{"checkpoint":"cp-1"}`, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/restore", `{"checkpoint":"cp-7"}`, 404, "not_found", `no checkpoint cp-7`},
		{"POST", "/v1/vms/box/fork", `{"name":"copy","checkpoint":"cp-7"}`, 404, "not_found", `no checkpoint cp-7`},
		{"POST", "/v1/vms/box/fork", `{"name":"Copy"}`, 400, "invalid", `bad vm name "Copy"`},
		{"POST", "/v1/vms/ghost/checkpoints", `{}`, 404, "not_found", `no vm named "ghost"`},
		{"POST", "/v1/vms/box/sleep", `{"forse":true}`, 400, "invalid", `unknown field "forse"`},
		{"POST", "/v1/vms/box/resize", `{"disk_bytes":1}`, 400, "invalid", `bad disk size 1 bytes`},
	}
	for _, c := range cases {
		body := c.body
		if len(body) > 60 {
			body = body[:60] + "..."
		}
		resp, data := d.request(c.method, c.path, []byte(c.body))
		var eb api.ErrorBody
		if err := json.Unmarshal(data, &eb); err != nil || resp.StatusCode != c.status || eb.Code != c.code || !strings.Contains(eb.Error, c.want) {
			t.Errorf("%s %s %s: %s %s\nwant %d, code %s, an error with %q", c.method, c.path, body, resp.Status, bytes.TrimSpace(data), c.status, c.code, c.want)
		}
	}
	if names := d.vmNames(); len(names) != 1 || names[0] != "box" {
		t.Errorf("vms after the refused requests: %v, want [box]", names)
	}
	if cps := d.checkpoints("box"); len(cps) != 0 {
		t.Errorf("checkpoints after the refused requests: %+v", cps)
	}
	if vm := d.apiVM("box"); vm.Generation != gen || vm.State != "running" {
		t.Errorf("box after the refused requests: %+v (generation was %d)", vm, gen)
	}
	// The CLI says the daemon's refusal and exits non-zero.
	if _, err := d.run("restore", "box", "cp-7"); exitCode(err) != 1 || !strings.Contains(stderrOf(err), "no checkpoint cp-7") {
		t.Errorf("den restore box cp-7: %v", err)
	}
}

// apiVM is a VM as GET /v1/vms/NAME shows it.
func (d *daemon) apiVM(name string) api.VM {
	d.t.Helper()
	resp, data := d.request("GET", "/v1/vms/"+name, nil)
	var vm api.VM
	if resp.StatusCode != 200 || json.Unmarshal(data, &vm) != nil {
		d.t.Fatalf("GET /v1/vms/%s: %s %s", name, resp.Status, data)
	}
	return vm
}

// TestAPIStreamFailure: an operation that fails after its progress began
// (here: QEMU refuses to load a snapshot, after the disk is cloned) ends
// its stream with a final line that carries the error and its code, and
// the CLI exits non-zero with that error.
func TestAPIStreamFailure(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64 in PATH")
	}
	// A QEMU that, once told to, refuses to start for an incoming
	// snapshot (restores, wakes, forks from memory): boots still work.
	// VMMs run as den's unprivileged user: it must reach the wrapper.
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	refuse := filepath.Join(dir, "refuse")
	wrapper := filepath.Join(dir, "qemu")
	script := "#!/bin/sh\n" +
		"if [ -e " + refuse + " ]; then\n" +
		"  for a in \"$@\"; do [ \"$a\" = -incoming ] && { echo 'den e2e: this qemu refuses snapshots' >&2; exit 1; }; done\n" +
		"fi\n" +
		"exec " + qemu + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEN_QEMU_BINARY", wrapper)
	d := startDaemon(t)
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	d.must("checkpoint", "box")
	if err := os.WriteFile(refuse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(refuse) }) // before the daemon's teardown

	// Raw: 200, progress lines, then the final error line.
	resp, data := d.request("POST", "/v1/vms/box/fork", []byte(`{"name":"copy","checkpoint":"cp-1"}`))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("fork: %s %s, want a stream", resp.Status, data)
	}
	var evs []api.Event
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("fork: line %q: %v", sc.Bytes(), err)
		}
		evs = append(evs, ev)
	}
	if len(evs) < 2 || evs[0].Progress == "" {
		t.Fatalf("fork: stream %s, want progress first", data)
	}
	if last := evs[len(evs)-1]; !last.Done || last.Error == "" || last.Code == "" || last.VM != nil {
		t.Fatalf("fork: final line %+v, want done with an error and its code", last)
	}
	if names := d.vmNames(); len(names) != 1 || names[0] != "box" {
		t.Fatalf("vms after the failed fork: %v", names)
	}

	// The CLI: progress, then the error, and a non-zero exit.
	_, err = d.run("restore", "box", "cp-1")
	if exitCode(err) != 1 {
		t.Fatalf("den restore that fails mid-way: %v, want exit status 1", err)
	}
	stderr := stderrOf(err)
	if !strings.Contains(stderr, "saving the current state first") || !strings.Contains(stderr, `den: restore vm "box" to cp-1`) {
		t.Fatalf("den restore that fails mid-way: stderr %q, want its progress and its error", stderr)
	}
}

// TestClockAfterSleepAndRestore: a guest's wall clock is the host's again
// after a wake and after a restore, however long it slept or how old the
// checkpoint is. (Its monotonic clock does not count the time asleep:
// logged, not asserted.)
func TestClockAfterSleepAndRestore(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "clock", "--memory", "256M", "--idle-timeout", "0")
	clocks := func(when string) (wall int64, uptime float64) {
		t.Helper()
		before := time.Now().Unix()
		out := d.must("exec", "clock", "--", "sh", "-c", "date +%s; cut -d' ' -f1 /proc/uptime")
		after := time.Now().Unix()
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("%s: clocks %q", when, out)
		}
		wall, err1 := strconv.ParseInt(f[0], 10, 64)
		uptime, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: clocks %q", when, out)
		}
		// The guest read its clock between before and after; a few
		// seconds either side for the set clock's own latency.
		const slack = 3
		if wall < before-slack || wall > after+slack {
			t.Errorf("%s: guest wall clock %d, host %d..%d: off by more than %ds", when, wall, before, after, slack)
		}
		t.Logf("%s: guest wall clock %d (host %d..%d), uptime %.2fs", when, wall, before, after, uptime)
		return wall, uptime
	}
	wall0, up0 := clocks("before the sleep")
	d.must("checkpoint", "clock")
	d.must("sleep", "clock")
	// Asleep for longer than the slack, so that a clock left as it was
	// would be caught.
	const asleep = 10 * time.Second
	deadline := time.Now().Add(asleep)
	for time.Now().Before(deadline) {
		if vm := d.info("clock"); vm.State != "sleeping" {
			t.Fatalf("vm woke by itself: %+v", vm)
		}
		time.Sleep(time.Second)
	}
	d.must("wake", "clock")
	wall1, up1 := clocks("after the wake")
	t.Logf("across the sleep: wall clock +%ds, uptime +%.1fs (the time asleep is not counted)", wall1-wall0, up1-up0)
	d.must("restore", "clock", "cp-1", "--no-save")
	wall2, up2 := clocks("after the restore")
	t.Logf("across the restore: wall clock +%ds, uptime %+.1fs (back to the checkpoint's)", wall2-wall0, up2-up0)
}
