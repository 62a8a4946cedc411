//go:build linux

package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/denhq/den/api"
	"github.com/denhq/den/mcpserver"
)

// mcpSession is an MCP client session with the server at endpoint,
// through hc.
func mcpSession(t *testing.T, endpoint string, hc *http.Client) *mcp.ClientSession {
	return mcpSessionWith(t, endpoint, hc, nil)
}

// mcpSessionWith is mcpSession with the client's options.
func mcpSessionWith(t *testing.T, endpoint string, hc *http.Client, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	tr := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "den-test"}, opts).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("mcp connect %s: %v", endpoint, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// tlsHTTP is an HTTP client of the TLS listener that sends token.
func (e *apiEnv) tlsHTTP(token string) *http.Client {
	e.t.Helper()
	pem, err := os.ReadFile(e.tlsLn.certFile)
	if err != nil {
		e.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}
	return &http.Client{Timeout: testTimeout, Transport: bearer{token, tr}}
}

// call calls a tool and returns its result's structured content decoded
// into out (if not nil) and its text.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, out any) (isError bool, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("mcp %s: protocol error: %v", tool, err)
	}
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if out != nil && res.StructuredContent != nil {
		data, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("mcp %s: structured content %s: %v", tool, data, err)
		}
	}
	return res.IsError, text
}

// TestMCPOverHTTP: /v1/mcp on the TLS listener acts as the token's user:
// alice's tools run commands, read and write files and checkpoint her
// VM, and read its checkpoint tree; bob's token neither sees nor touches
// it; no token is refused before MCP; the audit log has the calls as
// alice's, from mcp.
func TestMCPOverHTTP(t *testing.T) {
	e := newAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	alice := e.asCaller(Caller{User: "alice", Source: "test"})
	bob := e.asCaller(Caller{User: "bob", Source: "test"})
	if _, err := alice.CreateVM(ctx, api.CreateRequest{Name: "abox", MemoryBytes: 128 << 20, DiskBytes: imageSize, IdleTimeout: "0", Cold: true}, nil); err != nil {
		t.Fatal(err)
	}
	atok, err := alice.AddToken(ctx, api.AddTokenRequest{Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	btok, err := bob.AddToken(ctx, api.AddTokenRequest{Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "https://" + e.tlsLn.addr + "/v1/mcp"
	var stepsMu sync.Mutex
	var steps []string
	as := mcpSessionWith(t, endpoint, e.tlsHTTP(atok.Secret), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			stepsMu.Lock()
			defer stepsMu.Unlock()
			steps = append(steps, req.Params.Message)
		},
	})
	bs := mcpSession(t, endpoint, e.tlsHTTP(btok.Secret))

	// A create, its steps sent as progress when asked for.
	params := &mcp.CallToolParams{Name: "create", Arguments: map[string]any{"name": "amore", "memory": "128M", "disk": "8M", "idle_timeout": "0", "cold": true}}
	params.SetProgressToken("create-amore")
	if res, err := as.CallTool(ctx, params); err != nil || res.IsError {
		t.Fatalf("create over mcp: %v %+v", err, res)
	}
	stepsMu.Lock()
	if len(steps) == 0 || steps[0] == "" {
		t.Errorf("create's progress: %q", steps)
	}
	stepsMu.Unlock()
	if vm, err := alice.GetVM(ctx, "amore"); err != nil || vm.Owner != "alice" || vm.State != "running" {
		t.Fatalf("the vm made over mcp: %+v %v", vm, err)
	}
	if err := alice.RemoveVM(ctx, "amore", true); err != nil {
		t.Fatal(err)
	}

	var list struct{ VMs []api.VM }
	if isErr, text := call(t, as, "list", nil, &list); isErr || len(list.VMs) != 1 || list.VMs[0].Name != "abox" {
		t.Fatalf("alice's list: %s", text)
	}
	var ex mcpserver.ExecOutput
	isErr, text := call(t, as, "exec", map[string]any{"name": "abox", "command": "echo hi; echo oops >&2; printf %s \"$GREETING\"; exit 3", "env": []string{"GREETING=hello"}}, &ex)
	if isErr || ex.ExitStatus != 3 || ex.Stdout != "hi\nhello" || ex.Stderr != "oops\n" || ex.Truncated {
		t.Fatalf("alice's exec: %s", text)
	}
	isErr, text = call(t, as, "exec", map[string]any{"name": "abox", "command": "tr a-z A-Z", "stdin": "quiet\n"}, &ex)
	if isErr || ex.ExitStatus != 0 || ex.Stdout != "QUIET\n" {
		t.Fatalf("exec with stdin: %s", text)
	}
	isErr, text = call(t, as, "exec", map[string]any{"name": "abox", "command": "seq 1 10000", "max_output_bytes": 10}, &ex)
	if isErr || ex.ExitStatus != 0 || ex.Stdout != "1\n2\n3\n4\n5\n" || !ex.Truncated || ex.StdoutBytes != 48894 {
		t.Fatalf("capped exec: %s", text)
	}
	ex = mcpserver.ExecOutput{}
	isErr, text = call(t, as, "exec", map[string]any{"name": "abox", "command": "echo started; exec sleep 60", "timeout_seconds": 1}, &ex)
	if !isErr || !ex.TimedOut || ex.Stdout != "started\n" {
		t.Fatalf("exec past its timeout: error %v: %s", isErr, text)
	}

	// Files (the fake VMM's agent works on this host's files).
	path := filepath.Join(t.TempDir(), "notes.txt")
	if isErr, text := call(t, as, "write_file", map[string]any{"name": "abox", "path": path, "content": "line one\n", "mode": "0600"}, nil); isErr {
		t.Fatalf("write_file: %s", text)
	}
	if isErr, text := call(t, as, "write_file", map[string]any{"name": "abox", "path": path, "content": "bGluZSB0d28K", "encoding": "base64", "append": true}, nil); isErr {
		t.Fatalf("write_file append: %s", text)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "line one\nline two\n" {
		t.Fatalf("the file written: %q %v", data, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the file's mode: %v %v", fi.Mode(), err)
	}
	var rf mcpserver.ReadFileOutput
	if isErr, text := call(t, as, "read_file", map[string]any{"name": "abox", "path": path, "offset": 5, "max_bytes": 3}, &rf); isErr || rf.Content != "one" || rf.Encoding != "text" || rf.Size != 18 || !rf.Truncated {
		t.Fatalf("read_file: %s", text)
	}
	if isErr, text := call(t, as, "read_file", map[string]any{"name": "abox", "path": path + ".missing"}, nil); !isErr || !strings.Contains(text, "not exist") {
		t.Fatalf("read_file of a missing file: %v %s", isErr, text)
	}

	// A checkpoint, and the tree as a resource.
	var cp api.Checkpoint
	if isErr, text := call(t, as, "checkpoint", map[string]any{"name": "abox", "comment": "from mcp"}, &cp); isErr || cp.ID != "cp-1" {
		t.Fatalf("checkpoint: %s", text)
	}
	rr, err := as.ReadResource(ctx, &mcp.ReadResourceParams{URI: "den://vms/abox/checkpoints"})
	if err != nil || len(rr.Contents) != 1 || !strings.Contains(rr.Contents[0].Text, `"from mcp"`) || !strings.Contains(rr.Contents[0].Text, "cp-1") {
		t.Fatalf("alice's checkpoint tree: %+v %v", rr, err)
	}
	lr, err := as.ListResources(ctx, nil)
	if err != nil || len(lr.Resources) != 1 || lr.Resources[0].URI != "den://vms/abox/checkpoints" {
		t.Fatalf("alice's resources: %+v %v", lr, err)
	}

	// bob: nothing of alice's, in the same words as a VM that does not exist.
	if isErr, text := call(t, bs, "list", nil, &list); isErr || len(list.VMs) != 0 {
		t.Errorf("bob's list: %s", text)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"info", map[string]any{"name": "abox"}},
		{"exec", map[string]any{"name": "abox", "command": "touch " + path + ".bob"}},
		{"read_file", map[string]any{"name": "abox", "path": path}},
		{"write_file", map[string]any{"name": "abox", "path": path, "content": "bob was here"}},
		{"checkpoint", map[string]any{"name": "abox"}},
		{"checkpoints", map[string]any{"name": "abox"}},
		{"restore", map[string]any{"name": "abox", "checkpoint": "cp-1"}},
		{"fork", map[string]any{"name": "abox", "new_name": "bcopy"}},
		{"diff", map[string]any{"name": "abox", "from": "cp-1"}},
		{"sleep", map[string]any{"name": "abox"}},
		{"wake", map[string]any{"name": "abox"}},
		{"url", map[string]any{"name": "abox"}},
	} {
		if isErr, text := call(t, bs, c.tool, c.args, nil); !isErr || !strings.Contains(text, `no vm named "abox"`) {
			t.Errorf("bob's %s of abox: error %v: %s", c.tool, isErr, text)
		}
	}
	if _, err := bs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "den://vms/abox/checkpoints"}); err == nil {
		t.Error("bob read alice's checkpoint tree")
	}
	if lr, err := bs.ListResources(ctx, nil); err != nil || len(lr.Resources) != 0 {
		t.Errorf("bob's resources: %+v %v", lr, err)
	}
	if _, err := os.Stat(path + ".bob"); err == nil {
		t.Error("bob's exec ran in alice's VM")
	}
	if data, _ := os.ReadFile(path); string(data) != "line one\nline two\n" {
		t.Errorf("alice's file after bob: %q", data)
	}
	if cps, err := alice.Checkpoints(ctx, "abox"); err != nil || len(cps) != 1 {
		t.Errorf("alice's checkpoints after bob: %+v %v", cps, err)
	}

	// No token, a wrong one: 401 before MCP.
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, tok := range []string{"", "den_wrong"} {
		hc := e.tlsHTTP(tok)
		req, _ := http.NewRequest("POST", endpoint, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %s, want 401", tok, resp.Status)
		}
	}

	// The audit log: alice's exec through MCP, as hers.
	recs, err := alice.Audit(ctx, api.AuditQuery{VM: "abox"})
	if err != nil {
		t.Fatal(err)
	}
	sawMCP := false
	for _, r := range recs {
		if r.User != "alice" {
			t.Errorf("alice's audit has %+v", r)
		}
		if strings.HasPrefix(r.Source, "mcp tls ") && strings.HasSuffix(r.Verb, "/ssh") {
			sawMCP = true
		}
	}
	if !sawMCP {
		t.Errorf("alice's exec through mcp is not in her audit log: %+v", recs)
	}
}
