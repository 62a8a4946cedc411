package daemon

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/api"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/netlimit"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/users"
)

// volumeDir is the fake volume's directory (newAPIEnv's layout).
func (e *apiEnv) volumeDir() string { return filepath.Join(filepath.Dir(e.socket), "volume") }

// tree lists every file and directory under dir with its size: what a
// refused request must leave as it was.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		size := info.Size()
		if d.IsDir() {
			size = 0
		}
		out = append(out, fmt.Sprintf("%s %s %d", strings.TrimPrefix(p, dir), info.Mode().Type(), size))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// withKernelArtifacts lists the image directory's kernel and initramfs in
// its manifest beside the root filesystem, as a built image does, with
// files of their names: they are files of the image directory, not
// images.
func (e *apiEnv) withKernelArtifacts() {
	e.t.Helper()
	images := image.Dir(filepath.Join(filepath.Dir(e.socket), "images"))
	man, err := images.Manifest()
	if err != nil {
		e.t.Fatal(err)
	}
	man.Artifacts = append(man.Artifacts,
		image.Artifact{Name: "bzImage", File: "bzImage", Kind: "kernel", Key: "k"},
		image.Artifact{Name: "initramfs", File: "initramfs.img", Kind: "initramfs", Key: "i"})
	data, _ := json.Marshal(man)
	for path, content := range map[string][]byte{images.ManifestPath(): data, images.BzImage(): []byte("kernel"),
		images.Initramfs(): []byte("initramfs"), filepath.Join(images.Path(), "bzImage.ext4"): []byte("not an image")} {
		if err := os.WriteFile(path, content, 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
}

// doWith sends a raw request with extra headers.
func (e *apiEnv) doWith(method, path string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, "http://den"+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
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

func jsonBody(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
}

// TestValidationAPI: every input of the API that names something (VM
// names in the path and the body, owners in the header and the body,
// images, checkpoint ids, key users, names and references) and every
// free string over its limit is refused with its documented answer
// before any work: no VM, checkpoint or key on record, no VM changed and
// nothing on the volume changed (no image directory made for bzImage).
func TestValidationAPI(t *testing.T) {
	e := newAPIEnv(t)
	e.withKernelArtifacts()
	e.create("box")
	before, err := e.m.Record(context.Background(), "box")
	if err != nil {
		t.Fatal(err)
	}
	// The create's spare disk (machine/spares.go) is made in the
	// background: the volume is listed once it is in place (there, and
	// no clone of it under way).
	var vol []string
	if !poll.Until(testTimeout, func() bool {
		vol = tree(t, e.volumeDir())
		all := strings.Join(vol, "\n")
		return strings.Contains(all, "/spares/disk-") && !strings.Contains(all, "clone")
	}) {
		t.Fatalf("the create's spare disk is still being made:\n%s", strings.Join(vol, "\n"))
	}
	boots := e.drv.Boots()

	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := ssh.NewSignerFromKey(priv)
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	long := strings.Repeat("a", 300)
	nul := "a\x00b"

	cases := []struct {
		name         string
		method, path string
		body         string
		hdr          map[string]string
		status       int
		code, want   string
	}{
		// VM names, in the body and in the path.
		{"name ../x", "POST", "/v1/vms", `{"name":"../x"}`, nil, 400, "invalid", `bad vm name "../x"`},
		{"name NUL", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: nul}), nil, 400, "invalid", `bad vm name "a\x00b"`},
		{"name 300 bytes", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: long}), nil, 400, "invalid", `(300 bytes)`},
		{"name reserved", "POST", "/v1/vms", `{"name":"den"}`, nil, 400, "invalid", `reserved`},
		{"path name", "GET", "/v1/vms/Bad_Name", ``, nil, 400, "invalid", `bad vm name "Bad_Name"`},
		{"path name 300 bytes", "POST", "/v1/vms/" + long + "/wake", ``, nil, 400, "invalid", `(300 bytes)`},
		{"path name checkpoint", "POST", "/v1/vms/a..b/checkpoints", `{}`, nil, 400, "invalid", `bad vm name "a..b"`},
		{"fork name", "POST", "/v1/vms/box/fork", `{"name":"../x"}`, nil, 400, "invalid", `bad vm name "../x"`},
		// Owners, in the body and the header.
		{"owner ../x", "POST", "/v1/vms", `{"name":"x","owner":"../x"}`, nil, 400, "invalid", `bad user name "../x"`},
		{"owner NUL", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: "x", Owner: "../x" + nul}), nil, 400, "invalid", `bad user name`},
		{"owner 300 bytes", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: "x", Owner: long}), nil, 400, "invalid", `(300 bytes)`},
		// Images: a bad name is invalid; a file of the image directory
		// that is not a root filesystem, or a name it does not list, is
		// not found.
		{"image bzImage", "POST", "/v1/vms", `{"name":"x","image":"bzImage"}`, nil, 404, "not_found", `no image named "bzImage" (images: minimal)`},
		{"image initramfs", "POST", "/v1/vms", `{"name":"x","image":"initramfs"}`, nil, 404, "not_found", `no image named "initramfs"`},
		{"image unknown", "POST", "/v1/vms", `{"name":"x","image":"nonesuch"}`, nil, 404, "not_found", `no image named "nonesuch"`},
		{"image ../x", "POST", "/v1/vms", `{"name":"x","image":"../x"}`, nil, 400, "invalid", `bad image name "../x"`},
		{"image NUL", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: "x", Image: "minimal" + nul}), nil, 400, "invalid", `bad image name`},
		{"image 300 bytes", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: "x", Image: long}), nil, 400, "invalid", `(300 bytes)`},
		// Checkpoint ids.
		{"restore ../x", "POST", "/v1/vms/box/restore", `{"checkpoint":"../x"}`, nil, 400, "invalid", `bad checkpoint id "../x"`},
		{"restore NUL", "POST", "/v1/vms/box/restore", jsonBody(api.RestoreRequest{Checkpoint: "cp-1" + nul}), nil, 400, "invalid", `bad checkpoint id`},
		{"restore 300 bytes", "POST", "/v1/vms/box/restore", jsonBody(api.RestoreRequest{Checkpoint: "cp-1" + strings.Repeat("0", 296)}), nil, 400, "invalid", `(300 bytes)`},
		{"fork checkpoint", "POST", "/v1/vms/box/fork", `{"name":"y","checkpoint":"cp-0"}`, nil, 400, "invalid", `bad checkpoint id "cp-0"`},
		{"verify checkpoint", "POST", "/v1/vms/box/checkpoints/verify", `{"checkpoint":"x"}`, nil, 400, "invalid", `bad checkpoint id "x"`},
		{"delete checkpoint", "DELETE", "/v1/vms/box/checkpoints/cp-x", ``, nil, 400, "invalid", `bad checkpoint id "cp-x"`},
		// Comments: 4 KiB of UTF-8 without NUL.
		{"comment 1 MB", "POST", "/v1/vms/box/checkpoints", jsonBody(api.CheckpointRequest{Comment: strings.Repeat("c", 1000_000)}), nil, 400, "invalid", `checkpoint comment of 1000000 bytes is too long: at most 4096`},
		{"comment 4 KiB + 1", "POST", "/v1/vms/box/checkpoints", jsonBody(api.CheckpointRequest{Comment: strings.Repeat("c", 4097)}), nil, 400, "invalid", `too long`},
		{"comment NUL", "POST", "/v1/vms/box/checkpoints", jsonBody(api.CheckpointRequest{Comment: nul}), nil, 400, "invalid", `no NUL`},
		{"body 20 MB", "POST", "/v1/vms/box/checkpoints", `{"comment":"` + strings.Repeat("c", 20<<20) + `"}`, nil, 413, "invalid", `request body too large`},
		{"create body 20 MB", "POST", "/v1/vms", `{"name":"x","image":"` + strings.Repeat("c", 20<<20) + `"}`, nil, 413, "invalid", `request body too large`},
		// Keys: users, names (the comment by default), the key, references.
		{"key user ../x", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{User: "../x", PublicKey: pub}), nil, 400, "invalid", `bad user name "../x"`},
		{"key user NUL", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{User: nul, PublicKey: pub}), nil, 400, "invalid", `bad user name`},
		{"key name 300 bytes", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{Name: long, PublicKey: pub}), nil, 400, "invalid", `key name of 300 bytes is too long`},
		{"key name NUL", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{Name: nul, PublicKey: pub}), nil, 400, "invalid", `no NUL`},
		{"key name control", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{Name: "a\x1b[2Jb", PublicKey: pub}), nil, 400, "invalid", `no control characters`},
		{"key comment 300 bytes", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{PublicKey: pub + " " + long}), nil, 400, "invalid", `key name of 300 bytes is too long`},
		{"key comment 1 MB", "POST", "/v1/keys", jsonBody(api.AddKeyRequest{PublicKey: pub + " " + strings.Repeat("k", 1000_000)}), nil, 400, "invalid", `public key of 1000`},
		{"key ref 300 bytes", "DELETE", "/v1/keys?ref=" + long, ``, nil, 400, "invalid", `key fingerprint or name of 300 bytes is too long`},
		// Durations.
		{"idle timeout 300 bytes", "POST", "/v1/vms", jsonBody(api.CreateRequest{Name: "x", IdleTimeout: long}), nil, 400, "invalid", `idle timeout of 300 bytes is too long`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, data := e.doWith(c.method, c.path, []byte(c.body), c.hdr)
			var eb api.ErrorBody
			if err := json.Unmarshal(data, &eb); err != nil || resp.StatusCode != c.status || eb.Code != c.code ||
				!strings.Contains(eb.Error, c.want) {
				t.Errorf("%s %s: %s %s\nwant %d, code %s, an error with %q", c.method, c.path, resp.Status,
					bytes.TrimSpace(data[:min(len(data), 400)]), c.status, c.code, c.want)
			}
			if len(eb.Error) > 1000 {
				t.Errorf("the error echoes the value whole: %d bytes", len(eb.Error))
			}
		})
	}

	if names := e.vmNames(); len(names) != 1 || names[0] != "box" {
		t.Errorf("vms after the refused requests: %v, want [box]", names)
	}
	cps, _, err := e.m.Checkpoints(context.Background(), "box")
	if err != nil || len(cps) != 0 {
		t.Errorf("checkpoints after the refused requests: %v %v", cps, err)
	}
	keys, err := e.client.ListKeys(context.Background())
	if err != nil || len(keys) != 0 {
		t.Errorf("keys after the refused requests: %v %v", keys, err)
	}
	after, err := e.m.Record(context.Background(), "box")
	if err != nil {
		t.Fatal(err)
	}
	if after.Generation != before.Generation || after.State != registry.StateRunning {
		t.Errorf("box changed: %+v, was %+v", after, before)
	}
	if n := e.drv.Boots(); n != boots {
		t.Errorf("%d boots during the refused requests", n-boots)
	}
	if got := tree(t, e.volumeDir()); strings.Join(got, "\n") != strings.Join(vol, "\n") {
		t.Errorf("the volume changed:\n%s\nwas:\n%s", strings.Join(got, "\n"), strings.Join(vol, "\n"))
	}

	// At the limits, the values are taken.
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cp, err := e.client.Checkpoint(ctx, "box", api.CheckpointRequest{Comment: strings.Repeat("é", validate.MaxComment/2)}, nil)
	if err != nil || len(cp.Comment) != validate.MaxComment {
		t.Errorf("a comment of %d bytes: %v (%d bytes kept)", validate.MaxComment, err, len(cp.Comment))
	}
	if _, err := e.client.AddKey(ctx, api.AddKeyRequest{User: "alice@example.com", PublicKey: pub + " " + strings.Repeat("n", validate.MaxKeyName)}); err != nil {
		t.Errorf("a key comment of %d bytes: %v", validate.MaxKeyName, err)
	}
}

// TestValidationGateway: the gateway's VM@host asks the backend for the
// VM named by the SSH user name: a bad name is refused there too, before
// anything looks at the VM.
func TestValidationGateway(t *testing.T) {
	e := newAPIEnv(t)
	b := gatewayBackend{m: e.m, keys: users.Keys{}}
	for _, vm := range []string{"../x", "a\x00b", strings.Repeat("a", 64<<10), "den"} {
		up, err := b.Open(context.Background(), vm, "alice")
		if !errors.Is(err, machine.ErrInvalid) || up != nil {
			t.Errorf("open %s: %v, want invalid", validate.Quote(vm), err)
		}
		if err != nil && len(err.Error()) > 300 {
			t.Errorf("open: the error echoes the name whole (%d bytes)", len(err.Error()))
		}
	}
	if _, err := b.Open(context.Background(), "box", "../x"); !errors.Is(err, machine.ErrInvalid) {
		t.Errorf("open box for user ../x: %v, want invalid", err)
	}
	if names := e.vmNames(); len(names) != 0 {
		t.Errorf("vms: %v", names)
	}
}

// TestServerTimeouts: the API socket's server has netlimit.API's limits;
// a client that sends half a header is cut after HeaderTimeout, and a
// request without a body is not cut by RequestTimeout while it is
// answered.
func TestServerTimeouts(t *testing.T) {
	srv := NewHTTPServer(http.NotFoundHandler(), nil, nil).Server
	l := netlimit.API
	if srv.ReadHeaderTimeout != l.HeaderTimeout || srv.ReadTimeout != l.RequestTimeout || srv.IdleTimeout != l.IdleTimeout ||
		srv.WriteTimeout != 0 || srv.MaxHeaderBytes != l.MaxHeaderBytes {
		t.Errorf("server: header %s, read %s, idle %s, write %s, headers %d", srv.ReadHeaderTimeout, srv.ReadTimeout,
			srv.IdleTimeout, srv.WriteTimeout, srv.MaxHeaderBytes)
	}
	if testing.Short() {
		t.Skip("waits ReadHeaderTimeout")
	}
	e := newAPIEnv(t)
	c, err := net.Dial("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /v1/vms HTTP/1.1\r\nHost: den\r\n"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(l.HeaderTimeout + 20*time.Second))
	_, err = io.ReadAll(c)
	if err != nil || time.Since(start) < l.HeaderTimeout-time.Second {
		t.Errorf("half a header: connection ended after %s (%v), want closed after %s", time.Since(start), err, l.HeaderTimeout)
	}
	// Meanwhile, and after, other clients are served.
	if _, err := e.client.ListVMs(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestReadDeadlineLifted: once a request's body is read (net/http lifts
// the deadline then), ReadTimeout no longer applies: an answer that runs
// past it keeps its request's context (a stream, a lock wait that ends
// when the client goes away), with a body and without.
func TestReadDeadlineLifted(t *testing.T) {
	const readTimeout = 200 * time.Millisecond
	alive := make(chan error, 2)
	h := guard(func(w http.ResponseWriter, r *http.Request) {
		var req api.SleepRequest
		if !decode(w, r, &req) {
			alive <- errors.New("decode refused the body")
			return
		}
		deadline := time.NewTimer(5 * readTimeout)
		defer deadline.Stop()
		select {
		case <-r.Context().Done():
			alive <- fmt.Errorf("request context ended after the read deadline: %w", r.Context().Err())
		case <-deadline.C:
			alive <- nil
			w.WriteHeader(http.StatusNoContent)
		}
	})
	srv := NewHTTPServer(h, nil, nil).Server
	srv.ReadTimeout = readTimeout
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", ln.Addr().String())
		},
	}}
	for _, body := range []string{`{"force":true}`, ``} {
		resp, err := hc.Post("http://den/", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		resp.Body.Close()
		if err := <-alive; err != nil || resp.StatusCode != http.StatusNoContent {
			t.Errorf("body %q: %s, %v", body, resp.Status, err)
		}
	}
}
