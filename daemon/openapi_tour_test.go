//go:build linux

package daemon

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/denhq/den/api"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/crypto/ssh"
)

// TestOpenAPITour calls every route once, as an admin, each with an
// answer that succeeds, on the API as the daemon serves it (a Manager
// over the fake VMM): checkOpenAPI checks every exchange against
// api/openapi.yaml, so every operation's success is held to the document
// at least once, and a route added without a call here fails the test.
func TestOpenAPITour(t *testing.T) {
	e := newAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	admin := Caller{User: "ops", Admin: true, Source: "test"}
	hc := &http.Client{Timeout: testTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return e.inproc.dial(ctx, admin) },
	}}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))

	called := map[string]bool{}
	call := func(method, path, body string, status int) []byte {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "http://den"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		_, pattern := e.srv.mux.Handler(req)
		called[pattern] = true
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != status || (status < 300 && bytes.Contains(data, []byte(`"error":`))) {
			t.Fatalf("%s %s: %s %s, want %d", method, path, resp.Status, data, status)
		}
		return data
	}

	call("GET", "/v1/info", "", 200)
	call("GET", "/v1/openapi.yaml", "", 200)
	call("POST", "/v1/vms", `{"name":"box","memory_bytes":134217728,"disk_bytes":8388608,"idle_timeout":"0","cold":true}`, 200)
	call("GET", "/v1/vms", "", 200)
	call("GET", "/v1/vms/box", "", 200)
	call("GET", "/v1/vms/box/logs", "", 200)
	call("GET", "/v1/vms/box/trace", "", 200)
	call("GET", "/v1/vms/box/net", "", 200)
	// The fake VMM's VMs have no TAP network, so no policy can be set:
	// the error answer is held to the document (GET .../net the NetInfo).
	call("POST", "/v1/vms/box/egress", `{"policy":"deny-all"}`, 400)
	call("GET", "/v1/vms/box/url", "", 200)
	call("POST", "/v1/vms/box/url", `{"port":8080,"public":true,"rotate":true}`, 200)
	call("POST", "/v1/vms/box/schedule", `{"every":"1h","keep":2,"keep_daily":7}`, 200)
	call("GET", "/v1/vms/box/schedule", "", 200)
	call("POST", "/v1/vms/box/schedule", `{"off":true}`, 200)
	call("POST", "/v1/vms/box/checkpoints", `{"comment":"one"}`, 200)
	call("GET", "/v1/vms/box/checkpoints", "", 200)
	call("POST", "/v1/vms/box/checkpoints/verify", `{"all":true}`, 200)
	call("POST", "/v1/vms/box/restore", `{"checkpoint":"cp-1"}`, 200)
	call("POST", "/v1/vms/box/fork", `{"name":"twin","checkpoint":"cp-1"}`, 200)
	// The fake VMM's disks are no ext4 to mount: the error answer of a
	// path out of the root is held to the document (the Diff schema is
	// held to its Go type by api's TestOpenAPIWireTypes, and e2e's
	// TestDiff reads real ones).
	call("POST", "/v1/vms/box/diff", `{"from":"cp-1","to_vm":"twin","path":"/root/../../etc"}`, 400)
	call("POST", "/v1/vms/box/restore-paths", `{"checkpoint":"cp-1","paths":["/"]}`, 400)
	call("DELETE", "/v1/vms/box/checkpoints/cp-2", "", 204)
	call("POST", "/v1/vms/box/sleep", `{}`, 200)
	call("POST", "/v1/vms/box/wake", "", 200)
	// One host, no cluster: a move is refused (e2e's TestClusterFence
	// moves VMs between real hosts).
	call("POST", "/v1/vms/box/move", `{"to":"host-b"}`, 409)
	call("POST", "/v1/hosts/host-b/drain", `{}`, 409)
	// The fake guest has no root device to grow: the error answer is held
	// to the document (the VM of a success is GET /v1/vms/{name}'s).
	call("POST", "/v1/vms/box/resize", `{"disk_bytes":16777216}`, 500)

	sshReq, _ := http.NewRequest("POST", "http://den/v1/vms/box/ssh", nil)
	_, pattern := e.srv.mux.Handler(sshReq)
	called[pattern] = true
	sc, err := e.asCaller(admin).SSH(ctx, "box")
	if err != nil {
		t.Fatalf("ssh: %v", err)
	}
	sc.Close()

	mcpReq, _ := http.NewRequest("POST", "http://den/v1/mcp", nil)
	_, pattern = e.srv.mux.Handler(mcpReq)
	called[pattern] = true
	ms := mcpSession(t, "http://den/v1/mcp", hc)
	if res, err := ms.CallTool(ctx, &mcp.CallToolParams{Name: "info", Arguments: map[string]any{"name": "box"}}); err != nil || res.IsError {
		t.Fatalf("mcp: info box: %v %v", err, res)
	}

	call("POST", "/v1/host/sleep", `{"timeout":"1m"}`, 200)
	call("POST", "/v1/host/wake", `{"parallel":2}`, 200)
	call("GET", "/v1/storage", "", 200)
	call("GET", "/v1/hosts", "", 200)
	call("POST", "/v1/host/gc", `{"dry_run":true}`, 200)
	call("POST", "/v1/keys", `{"user":"alice","name":"laptop","public_key":"`+pub+`"}`, 201)
	call("GET", "/v1/keys", "", 200)
	call("DELETE", "/v1/keys?ref=laptop", "", 200)
	call("POST", "/v1/tokens", `{"name":"ci","user":"alice"}`, 201)
	call("GET", "/v1/tokens", "", 200)
	call("DELETE", "/v1/tokens?ref=ci", "", 200)
	secretJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	_, secPriv, _ := ed25519.GenerateKey(rand.Reader)
	secPEM, err := ssh.MarshalPrivateKey(secPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	call("POST", "/v1/secrets", secretJSON(api.AddSecretRequest{Name: "deploy", Kind: "ssh", Value: string(pem.EncodeToMemory(secPEM)),
		KnownHosts: "git.test " + pub}), 201)
	call("POST", "/v1/secrets", secretJSON(api.AddSecretRequest{Name: "api", Kind: "https", Value: "Bearer t",
		Hosts: []string{"api.test"}, Header: "Authorization"}), 201)
	call("POST", "/v1/secrets", secretJSON(api.AddSecretRequest{Name: "bad", Kind: "https", Value: "t", Hosts: []string{"api.test"}}), 400)
	call("GET", "/v1/secrets", "", 200)
	call("PUT", "/v1/secrets/deploy", secretJSON(api.SetSecretRequest{Value: string(pem.EncodeToMemory(secPEM))}), 200)
	call("POST", "/v1/vms/box/secrets", `{"secret":"deploy"}`, 200)
	call("GET", "/v1/vms/box/secrets", "", 200)
	call("DELETE", "/v1/vms/box/secrets/deploy", "", 200)
	call("DELETE", "/v1/secrets/deploy", "", 200)
	call("GET", "/v1/audit?vm=box&limit=5", "", 200)
	call("GET", "/v1/vms/box/activity?kind=vm,session&last=5", "", 200)
	call("GET", "/v1/vms/box/activity?kind=files", "", 400)
	call("POST", "/v1/vms/box/activity/record", `{"on":false}`, 409) // the in-process agent records nothing
	call("DELETE", "/v1/vms/twin?force=1", "", 204)
	call("DELETE", "/v1/vms/box", "", 204)

	for _, rt := range routes {
		if !called[rt.pattern] {
			t.Errorf("the tour does not call %s", rt.pattern)
		}
	}
}
