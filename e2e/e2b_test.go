package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2BSDK: a program written with the official e2b npm package
// (e2e/e2bsdk, pinned in its package-lock.json) runs against den with
// E2B_API_URL and E2B_SANDBOX_URL set to the daemon's --e2b-listen
// address and E2B_API_KEY to a den token: create (debian), commands
// (output, env, cwd, exit codes, streaming, stdin, a terminal with input
// and resize, a background process listed, connected to and killed),
// files (write, read, list with depth, stat, make dir, rename, remove,
// 10 MiB by hash), watching a directory (recursive), metrics, another
// user's token seeing nothing, list filters, timeout, pause (den sleep)
// and connect (a file in /dev/shm kept), fork with a count of 4 (memory
// kept, hostnames their own), a snapshot, a
// sandbox from it and its deletion, kill, errors, and a timeout that
// pauses.
// Then bad requests get E2B's error shape and status.
func TestE2BSDK(t *testing.T) {
	node, sdkDir := e2bSDK(t)
	d := startDaemonIn(t, func(string) []string { return []string{"--e2b-listen", "127.0.0.1:0"} })
	base := e2bAddr(t, d)
	alice := strings.TrimSpace(d.must("tokens", "add", "--user", "den-e2b-alice", "sdk"))
	bob := strings.TrimSpace(d.must("tokens", "add", "--user", "den-e2b-bob", "other"))

	start := time.Now()
	cmd := exec.Command(node, "sdk-test.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+base, "E2B_SANDBOX_URL="+base, "E2B_API_KEY="+alice,
		"DEN_E2B_OTHER_KEY="+bob, "DEN_E2B_TEMPLATE=debian")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	timer := time.AfterFunc(10*time.Minute, func() { _ = cmd.Process.Kill() })
	err := cmd.Run()
	timer.Stop()
	t.Logf("the SDK program (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		log, _ := os.ReadFile(d.logPath)
		t.Fatalf("the SDK program: %v\ndaemon log:\n%s", err, log)
	}
	var vms []struct {
		Name  string `json:"name"`
		Owner string `json:"owner"`
	}
	if err := json.Unmarshal([]byte(d.must("ls", "--json")), &vms); err != nil || len(vms) != 0 {
		t.Errorf("sandboxes left behind: %+v %v", vms, err)
	}

	// Bad input gets E2B's error shape: {"code": status, "message": ...}.
	for _, c := range []struct {
		method, path, key, body string
		headers                 map[string]string
		status                  int
		says                    string
	}{
		{"POST", "/v2/sandboxes", "den_wrong", `{"templateID":"base"}`, nil, 401, "not a valid den token"},
		{"GET", "/v2/sandboxes", "", "", nil, 401, "no API key"},
		{"POST", "/v2/sandboxes", alice, `{"templateID":`, nil, 400, "not the JSON"},
		{"POST", "/sandboxes", alice, `{"timeout":5}`, nil, 400, "templateID is required"},
		{"POST", "/v2/sandboxes", alice, `{"templateID":"no-such-image"}`, nil, 404, "template \"no-such-image\" not found"},
		{"POST", "/v2/sandboxes", alice, `{"templateID":"base","timeout":-1}`, nil, 400, "bad timeout"},
		{"GET", "/sandboxes/inosuch", alice, "", nil, 404, "not found"},
		{"DELETE", "/sandboxes/inosuch", alice, "", nil, 404, "not found"},
		{"POST", "/sandboxes/inosuch/pause", alice, "", nil, 404, "not found"},
		{"POST", "/sandboxes/inosuch/timeout", alice, `{"timeout":"x"}`, nil, 400, "whole number"},
		{"GET", "/v2/sandboxes?state=sleepy", alice, "", nil, 400, "bad state"},
		{"POST", "/v3/templates", alice, `{}`, nil, 501, "den image"},
		{"GET", "/volumes", alice, "", nil, 501, "den"},
		{"POST", "/sandboxes/inosuch/fork", alice, `{}`, nil, 404, "not found"},
		{"POST", "/sandboxes/inosuch/fork", alice, `{"count":17}`, nil, 400, "bad count"},
		{"POST", "/sandboxes/inosuch/snapshots", alice, `{}`, nil, 404, "not found"},
		{"POST", "/v2/sandboxes", alice, `{"templateID":"inosuch@cp-1"}`, nil, 404, "not found"},
		{"DELETE", "/templates/base", alice, "", nil, 501, "den images"},
		{"GET", "/no/such/call", alice, "", nil, 404, "not an E2B call"},
		{"GET", "/files?path=/etc/hostname", alice, "", map[string]string{"E2b-Sandbox-Id": "inosuch", "E2b-Sandbox-Port": "49983"}, 404, "not found"},
		{"GET", "/health", "", "", map[string]string{"E2b-Sandbox-Id": "inosuch"}, 401, "no API key"},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
		if c.key != "" {
			req.Header.Set("X-API-KEY", c.key)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if resp.StatusCode != c.status || json.Unmarshal(data, &e) != nil || e.Code != c.status ||
			!strings.Contains(e.Message, c.says) || !strings.HasPrefix(e.Message, "den: ") {
			t.Errorf("%s %s: %s %s (want %d saying %q)", c.method, c.path, resp.Status, data, c.status, c.says)
		}
	}
}

// e2bSDK is node and the folder of the pinned e2b SDK (e2e/e2bsdk); the
// test is skipped without node, and fails without the SDK.
func e2bSDK(t *testing.T) (node, dir string) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (make deps installs nodejs and npm)")
	}
	dir = filepath.Join(repoRoot(t), "e2e", "e2bsdk")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("the e2b SDK is not installed in %s: run make deps (%v)", dir, err)
	}
	return node, dir
}

// e2bAddr is the daemon's --e2b-listen URL (on its loopback), from den
// info.
func e2bAddr(t *testing.T, d *daemon) string {
	var info struct {
		E2B string `json:"e2b"`
	}
	if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil || !strings.HasPrefix(info.E2B, "http://127.0.0.1:") {
		t.Fatalf("den info: %+v %v", info, err)
	}
	return info.E2B
}
