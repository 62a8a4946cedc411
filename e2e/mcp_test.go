package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/denhq/den/api"
	"github.com/denhq/den/mcpserver"
)

// mcpCaller calls one MCP session's tools for a test.
type mcpCaller struct {
	t  *testing.T
	cs *mcp.ClientSession
}

// call calls tool and decodes its structured result into out (if not
// nil); it returns whether the result is an error, and its text.
func (m mcpCaller) call(tool string, args map[string]any, out any) (bool, string) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := m.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		m.t.Fatalf("mcp %s: protocol error: %v", tool, err)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if out != nil && !res.IsError {
		data, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(data, out); err != nil {
			m.t.Fatalf("mcp %s: %s: %v", tool, data, err)
		}
	}
	return res.IsError, text
}

// must calls a tool that must succeed.
func (m mcpCaller) must(tool string, args map[string]any, out any) {
	m.t.Helper()
	if isErr, text := m.call(tool, args, out); isErr {
		m.t.Fatalf("mcp %s %v: %s", tool, args, text)
	}
}

// exec runs a command through MCP, which must exit 0, and returns its
// stdout.
func (m mcpCaller) exec(vm, command string) string {
	m.t.Helper()
	var out mcpserver.ExecOutput
	m.must("exec", map[string]any{"name": vm, "command": command}, &out)
	if out.ExitStatus != 0 {
		m.t.Fatalf("mcp exec %s %q: %+v", vm, command, out)
	}
	return out.Stdout
}

// mcpOverHTTP connects to the daemon's /v1/mcp on its TLS listener
// with token.
func (d *daemon) mcpOverHTTP(t *testing.T, addr, token string) mcpCaller {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(d.state, "keys", "api.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: tokenTransport{token, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "den-e2e"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "https://" + addr + "/v1/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("mcp over https://%s/v1/mcp: %v", addr, err)
	}
	t.Cleanup(func() { cs.Close() })
	return mcpCaller{t, cs}
}

// tokenTransport sends a bearer token with every request.
type tokenTransport struct {
	token string
	next  http.RoundTripper
}

func (tt tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+tt.token)
	return tt.next.RoundTrip(r)
}

// TestMCP: an agent drives den through MCP, with the Go SDK's client, on
// one real guest and a fork of it. Over streamable HTTP with alice's
// token it creates a VM, runs commands (exit status, output, timeout),
// writes and reads a file, checkpoints and reads the checkpoint tree;
// bob's token neither sees nor touches that VM; alice's key reaches it
// through the SSH gateway's `den@host mcp`. Then a real `den mcp`
// process (stdio, the daemon's socket, as root) restores the checkpoint,
// forks it, puts the VM to sleep and wakes it, and gives its URL.
func TestMCP(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--api-listen", "127.0.0.1:0"} })
	var info struct {
		API string `json:"api"`
	}
	if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil || info.API == "" {
		t.Fatalf("den info: %+v %v", info, err)
	}
	alice := d.mcpOverHTTP(t, info.API, strings.TrimSpace(d.must("tokens", "add", "--user", "den-mcp-alice", "agent-a")))
	bob := d.mcpOverHTTP(t, info.API, strings.TrimSpace(d.must("tokens", "add", "--user", "den-mcp-bob", "agent-b")))

	// alice, over HTTP.
	var vm api.VM
	alice.must("create", map[string]any{"name": "mbox", "memory": "256M", "idle_timeout": "0"}, &vm)
	if vm.Owner != "den-mcp-alice" || vm.State != "running" {
		t.Fatalf("created: %+v", vm)
	}
	if out := alice.exec("mbox", "uname -s; hostname"); out != "Linux\nmbox\n" {
		t.Errorf("uname -s; hostname: %q", out)
	}
	var ex mcpserver.ExecOutput
	alice.must("exec", map[string]any{"name": "mbox", "command": "echo to-err >&2; exit 7"}, &ex)
	if ex.ExitStatus != 7 || ex.Stderr != "to-err\n" {
		t.Errorf("exit 7: %+v", ex)
	}
	ex = mcpserver.ExecOutput{}
	isErr, text := alice.call("exec", map[string]any{"name": "mbox", "command": "echo begun; sleep 120", "timeout_seconds": 2}, &ex)
	if !isErr || !strings.Contains(text, `"timed_out":true`) || !strings.Contains(text, "begun") {
		t.Errorf("exec past its timeout: error %v: %s", isErr, text)
	}
	alice.must("write_file", map[string]any{"name": "mbox", "path": "/root/notes.txt", "content": "before the checkpoint\n"}, nil)
	var rf mcpserver.ReadFileOutput
	alice.must("read_file", map[string]any{"name": "mbox", "path": "/root/notes.txt"}, &rf)
	if rf.Content != "before the checkpoint\n" || rf.Encoding != "text" {
		t.Errorf("read_file: %+v", rf)
	}
	if out := alice.exec("mbox", "cat /root/notes.txt"); out != "before the checkpoint\n" {
		t.Errorf("the file written, seen by cat: %q", out)
	}
	var cp api.Checkpoint
	alice.must("checkpoint", map[string]any{"name": "mbox", "comment": "notes written"}, &cp)
	if cp.ID != "cp-1" {
		t.Fatalf("checkpoint: %+v", cp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr, err := alice.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "den://vms/mbox/checkpoints"})
	if err != nil || len(rr.Contents) != 1 || !strings.Contains(rr.Contents[0].Text, "notes written") {
		t.Errorf("the checkpoint tree: %+v %v", rr, err)
	}

	// bob: alice's VM does not exist for him, and stays as it was.
	var list mcpserver.ListOutput
	bob.must("list", nil, &list)
	if len(list.VMs) != 0 {
		t.Errorf("bob's list: %+v", list.VMs)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"exec", map[string]any{"name": "mbox", "command": "rm /root/notes.txt"}},
		{"read_file", map[string]any{"name": "mbox", "path": "/root/notes.txt"}},
		{"write_file", map[string]any{"name": "mbox", "path": "/root/notes.txt", "content": "bob"}},
		{"sleep", map[string]any{"name": "mbox"}},
		{"restore", map[string]any{"name": "mbox", "checkpoint": "cp-1"}},
	} {
		if isErr, text := bob.call(c.tool, c.args, nil); !isErr || !strings.Contains(text, `no vm named "mbox"`) {
			t.Errorf("bob's %s: error %v: %s", c.tool, isErr, text)
		}
	}
	if _, err := bob.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "den://vms/mbox/checkpoints"}); err == nil {
		t.Error("bob read alice's checkpoint tree")
	}
	alice.exec("mbox", "echo after the checkpoint > /root/notes.txt")

	// alice again, on stdio through the SSH gateway, with her key.
	g := newGW(t, d)
	key := g.key("alice")
	d.must("keys", "add", "--user", "den-mcp-alice", key+".pub")
	gctx, gcancel := context.WithCancel(context.Background())
	t.Cleanup(gcancel)
	gcs, err := mcp.NewClient(&mcp.Implementation{Name: "den-e2e"}, nil).Connect(ctx,
		&mcp.CommandTransport{Command: g.sshCmd(gctx, key, "den@127.0.0.1", "mcp")}, nil)
	if err != nil {
		t.Fatalf("ssh den@ mcp: %v", err)
	}
	t.Cleanup(func() { gcs.Close() })
	viaSSH := mcpCaller{t, gcs}
	viaSSH.must("list", nil, &list)
	if len(list.VMs) != 1 || list.VMs[0].Name != "mbox" {
		t.Errorf("alice's list through the gateway: %+v", list.VMs)
	}
	if out := viaSSH.exec("mbox", "cat /root/notes.txt"); out != "after the checkpoint\n" {
		t.Errorf("through the gateway: %q", out)
	}

	// A real den mcp process on stdio, as root (an admin: every VM).
	cmd := exec.Command(d.den, "mcp")
	cmd.Env = append(os.Environ(), "DEN_SOCKET="+d.socket)
	cmd.Stderr = os.Stderr
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "den-e2e"}, nil).Connect(sctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("den mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	root := mcpCaller{t, cs}
	var restored api.Restored
	root.must("restore", map[string]any{"name": "mbox", "checkpoint": "cp-1", "no_save": true}, &restored)
	if out := root.exec("mbox", "cat /root/notes.txt"); out != "before the checkpoint\n" {
		t.Errorf("after the restore: %q", out)
	}
	root.must("fork", map[string]any{"name": "mbox", "checkpoint": "cp-1", "new_name": "mfork"}, &vm)
	if vm.Name != "mfork" || vm.Owner != "root" && vm.Owner != "den-mcp-alice" {
		t.Errorf("fork: %+v", vm)
	}
	if out := root.exec("mfork", "hostname; cat /root/notes.txt"); out != "mfork\nbefore the checkpoint\n" {
		t.Errorf("in the fork: %q", out)
	}
	root.must("sleep", map[string]any{"name": "mbox"}, &vm)
	root.must("info", map[string]any{"name": "mbox"}, &vm)
	if vm.State != "sleeping" {
		t.Errorf("after sleep: %+v", vm)
	}
	root.must("wake", map[string]any{"name": "mbox"}, &vm)
	if vm.State != "running" {
		t.Errorf("after wake: %+v", vm)
	}
	var u api.URLInfo
	root.must("url", map[string]any{"name": "mbox"}, &u)
	if u.Port != 8080 || u.Token == "" {
		t.Errorf("url: %+v", u)
	}
	root.must("list", nil, &list)
	if len(list.VMs) != 2 {
		t.Errorf("root's list: %+v", list.VMs)
	}
}
