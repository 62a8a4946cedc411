package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

const testKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvb7JXYQ9ZEl7sFq8fBtd0t1S1CMlAhB6Xhjds5AY7x laptop\n"

// fakeAPI is a stand-in for the daemon's API on a unix socket: it
// records each request and answers ls, info and keys.
type fakeAPI struct {
	socket string
	mu     sync.Mutex
	reqs   []fakeRequest
}

type fakeRequest struct {
	method, path string
	header       http.Header
	body         string
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	dir, err := os.MkdirTemp("", "den-cli-") // short: a unix socket lives in it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeAPI{socket: filepath.Join(dir, "den.sock")}
	ln, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return f
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, fakeRequest{r.Method, r.URL.Path, r.Header.Clone(), string(body)})
	f.mu.Unlock()
	var out any
	switch r.Method + " " + r.URL.Path {
	case "GET /v1/vms":
		out = []api.VM{{Name: "box", State: "running", CPUs: 1}}
	case "GET /v1/info":
		out = api.DaemonInfo{Version: "test", VMM: "qemu"}
	case "GET /v1/keys":
		out = []api.Key{{Fingerprint: "SHA256:x", User: "alice", PublicKey: testKey}}
	case "POST /v1/keys":
		var req api.AddKeyRequest
		_ = json.Unmarshal(body, &req)
		out = api.Key{Fingerprint: "SHA256:x", User: "alice", Name: req.Name, PublicKey: req.PublicKey}
	default:
		w.WriteHeader(http.StatusNotFound)
		out = api.ErrorBody{Error: "not found", Code: "not_found"}
	}
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeAPI) client() *api.Client { return api.NewClient(f.socket) }

// requests returns the requests received, and forgets them.
func (f *fakeAPI) requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.reqs
	f.reqs = nil
	return r
}

// runRemote runs a command line as the gateway does, with stdin.
func runRemote(cl *api.Client, stdin string, args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = RunRemote(context.Background(), cl, args, strings.NewReader(stdin), &o, &e)
	return o.String(), e.String(), code
}

// TestRemoteRefuses: through the gateway, a verb it does not run, a flag
// that names a host path or another daemon, in any spelling, and a key
// file are refused in one line, exit status 2, before anything reaches
// the daemon.
func TestRemoteRefuses(t *testing.T) {
	f := newFakeAPI(t)
	keyFile := filepath.Join(t.TempDir(), "id.pub")
	if err := os.WriteFile(keyFile, []byte(testKey), 0o644); err != nil {
		t.Fatal(err)
	}
	notHere := func(verb string) string {
		return fmt.Sprintf("den: %q cannot be run through the gateway; usage: ssh -p PORT den@HOST VERB", verb)
	}
	for _, tc := range []struct {
		args string
		want string
	}{
		{"ls --socket /x", "den: --socket cannot be given through the gateway"},
		{"ls -socket /x", "den: --socket cannot be given through the gateway"},
		{"ls --socket=/x", "den: --socket cannot be given through the gateway"},
		{"ls -socket=/x", "den: --socket cannot be given through the gateway"},
		{"ls --socket", "den: --socket cannot be given through the gateway"},
		{"ls --json --socket /x", "den: --socket cannot be given through the gateway"},
		{"ls --url https://127.0.0.1:1", "den: --url cannot be given through the gateway"},
		{"ls --url=https://127.0.0.1:1", "den: --url cannot be given through the gateway"},
		{"ls --token t", "den: --token cannot be given through the gateway"},
		{"ls -token=t", "den: --token cannot be given through the gateway"},
		{"ls --ca /etc/ssl/certs/ca-certificates.crt", "den: --ca cannot be given through the gateway"},
		{"ls --socket /x --help", "den: --socket cannot be given through the gateway"},
		{"info box --socket /x", "den: --socket cannot be given through the gateway"},
		{"create box --socket=/x --memory 1G", "den: --socket cannot be given through the gateway"},
		{"exec box --socket /x -- true", "den: --socket cannot be given through the gateway"},
		{"exec box --url=https://h:1 true", "den: --url cannot be given through the gateway"},
		{"checkpoint rm box cp-1 --socket /s", "den: --socket cannot be given through the gateway"},
		{"checkpoint --socket /s rm box cp-1", "den: --socket cannot be given through the gateway"},
		{"checkpoint verify box --ca /x", "den: --ca cannot be given through the gateway"},
		{"keys add - --socket=/s", "den: --socket cannot be given through the gateway"},
		{"keys ls --token t", "den: --token cannot be given through the gateway"},
		{"help ls --socket /x", "den: --socket cannot be given through the gateway"},
		// Host paths of verbs the gateway does not run are not flags here.
		{"ls --state-dir /x", "den ls: unknown flag --state-dir"},
		{"ls --images=/x", "den ls: unknown flag --images"},
		{"create box --volume-config /x", "den create: unknown flag --volume-config"},
		// "--" is no way around the checks.
		{"keys -- ls --socket /x", `den keys: a verb cannot come after "--"`},
		{"checkpoint -- rm box cp-1 --socket /x", `den checkpoint: a verb cannot come after "--"`},
		// A key comes on stdin, never from a file of the host.
		{"keys add " + keyFile, "den keys add: through the gateway the key comes on stdin: ssh den@HOST keys add - < key.pub"},
		{"keys add /etc/shadow", "den keys add: through the gateway the key comes on stdin"},
		{"keys add --name x /etc/shadow", "den keys add: through the gateway the key comes on stdin"},
		// Verbs the gateway does not run.
		{"daemon", notHere("daemon")},
		{"daemon --state-dir /x --socket /y", notHere("daemon")},
		{"doctor", notHere("doctor")},
		{"bench --images /x", notHere("bench")},
		{"ssh box", notHere("ssh")},
		{"forward box 80", notHere("forward")},
		{"crate box", notHere("crate")},
		{"help daemon", notHere("daemon")},
		{"--socket /x ls", notHere("--socket")},
		{"-- ls", notHere("--")},
		{"", "den: usage: ssh -p PORT den@HOST VERB [ARGS] (verbs: ls, info, create"},
		{"--help ls", "den: usage: ssh -p PORT den@HOST VERB"},
		{"--version --socket /x", "den: usage: ssh -p PORT den@HOST VERB"},
	} {
		stdout, stderr, code := runRemote(f.client(), testKey, strings.Fields(tc.args)...)
		if code != 2 || !strings.HasPrefix(stderr, tc.want) || strings.Count(stderr, "\n") != 1 || stdout != "" {
			t.Errorf("den %s: exit %d, stdout %q, stderr %q; want 2 and one line %q...", tc.args, code, stdout, stderr, tc.want)
		}
		if reqs := f.requests(); len(reqs) > 0 {
			t.Errorf("den %s: the daemon got %d request(s): %s %s", tc.args, len(reqs), reqs[0].method, reqs[0].path)
		}
	}
}

// TestRemoteAllowed: the gateway's verbs reach the daemon through the
// run's client, with no header of their own (the connection is the
// user's), whatever the daemon's environment says.
func TestRemoteAllowed(t *testing.T) {
	f := newFakeAPI(t)
	t.Setenv("DEN_SOCKET", filepath.Join(t.TempDir(), "other.sock"))
	t.Setenv("DEN_URL", "https://127.0.0.1:1")
	t.Setenv("DEN_TOKEN", "daemon's")
	t.Setenv("DEN_CA", "/etc/shadow")
	for _, tc := range []struct {
		args, stdin string
		path        string // the request the daemon gets; "" none
		out         string // in stdout
	}{
		{args: "ls --json", path: "GET /v1/vms", out: `"name": "box"`},
		{args: "ls", path: "GET /v1/vms", out: "box"},
		{args: "info", path: "GET /v1/info", out: "version:  test"},
		{args: "keys ls", path: "GET /v1/keys", out: "SHA256:x"},
		{args: "keys add - --name laptop", stdin: testKey, path: "POST /v1/keys", out: "added SHA256:x laptop for user alice"},
		{args: "--help", out: "USAGE:"},
		{args: "-h", out: "USAGE:"},
		{args: "--version", out: "den version"},
		{args: "help", out: "USAGE:"},
		{args: "help keys add", out: "den keys add [--user USER]"},
		{args: "keys help", out: "unregister a key"},
		{args: "ls --help", out: "den ls [--json]"},
	} {
		stdout, stderr, code := runRemote(f.client(), tc.stdin, strings.Fields(tc.args)...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, tc.out) {
			t.Errorf("den %s: exit %d, stderr %q, stdout %.200q; want 0 and %q", tc.args, code, stderr, stdout, tc.out)
		}
		reqs := f.requests()
		if tc.path == "" {
			if len(reqs) != 0 {
				t.Errorf("den %s: %d request(s), want none", tc.args, len(reqs))
			}
			continue
		}
		if len(reqs) != 1 || reqs[0].method+" "+reqs[0].path != tc.path {
			t.Errorf("den %s: requests %+v; want one %s", tc.args, reqs, tc.path)
			continue
		}
		for h := range reqs[0].header {
			if !slices.Contains([]string{"User-Agent", "Accept-Encoding", "Content-Type", "Content-Length"}, h) {
				t.Errorf("den %s: header %s: %q", tc.args, h, reqs[0].header.Get(h))
			}
		}
		if tc.stdin != "" && !strings.Contains(reqs[0].body, "AAAAC3NzaC1lZDI1NTE5") {
			t.Errorf("den %s: body %q, want the key from stdin", tc.args, reqs[0].body)
		}
	}
	// The help the gateway prints names none of the host's flags or
	// verbs, nor the environment.
	stdout, _, _ := runRemote(f.client(), "", "--help")
	for _, not := range []string{"daemon", "doctor", "bench", "forward"} {
		if strings.Contains(stdout, "   "+not+" ") {
			t.Errorf("den --help through the gateway lists %s:\n%s", not, stdout)
		}
	}
	stdout, _, _ = runRemote(f.client(), "", "ls", "--help")
	if strings.Contains(stdout, "--socket") || strings.Contains(stdout, "$DEN_") {
		t.Errorf("den ls --help through the gateway:\n%s", stdout)
	}
}

// TestRemoteFlags: the gateway's app has no flag that names a host path
// or a daemon, or that urfave/cli would fill from the environment or a
// file; and every verb it runs is den's.
func TestRemoteFlags(t *testing.T) {
	app := newApp(&Env{})
	restrictRemote(app)
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			for _, fl := range c.Flags {
				if isHostFlag(fl) {
					t.Errorf("%s %s: flag %s left for the gateway", path, c.Name, fl.Names()[0])
				}
				if ev, ok := flagField(fl, "EnvVars"); ok && ev.Len() > 0 {
					t.Errorf("%s %s: flag %s reads the environment", path, c.Name, fl.Names()[0])
				}
			}
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	walk("den", app.Commands)
	for _, v := range RemoteVerbs {
		if v != "help" && findCommand(app.Commands, v) == nil {
			t.Errorf("remote verb %s: den has no such verb", v)
		}
	}
	// The app the command line gets has them all.
	if f := findCommand(newApp(&Env{}).Commands, "ls"); !slices.ContainsFunc(f.Flags, func(fl cli.Flag) bool { return fl.Names()[0] == "socket" }) {
		t.Error("den ls has no --socket")
	}
}

// TestRemoteWritesNoProcessStream: a run writes to its own streams only,
// never to the process's (the daemon's).
func TestRemoteWritesNoProcessStream(t *testing.T) {
	f := newFakeAPI(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	for _, args := range [][]string{{"ls"}, {"ls", "--json"}, {"info"}, {"--help"}, {"--version"}, {"keys", "help"}, {"daemon"}, {"ls", "--socket", "/x"}, {"info", "nope"}, {"keys", "add", "/etc/shadow"}} {
		runRemote(f.client(), "", args...)
	}
	os.Stdout, os.Stderr = oldOut, oldErr
	w.Close()
	if got, _ := io.ReadAll(r); len(got) > 0 {
		t.Errorf("the process's stdout or stderr got %q", got)
	}
}

// TestRunConcurrent: runs at once share nothing (go test -race): each
// gets its own output, local runs with their own flags and remote ones.
func TestRunConcurrent(t *testing.T) {
	f := newFakeAPI(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				var args []string
				var want string
				var code int
				var o, e bytes.Buffer
				switch (g + i) % 5 {
				case 0:
					args, want = []string{"ls", "--json"}, `"name": "box"`
					code = RunRemote(context.Background(), f.client(), args, strings.NewReader(""), &o, &e)
				case 1:
					args, want = []string{"--help"}, "USAGE:"
					code = RunRemote(context.Background(), f.client(), args, strings.NewReader(""), &o, &e)
				case 2:
					args, want = []string{"keys", "help"}, "unregister a key"
					code = RunRemote(context.Background(), f.client(), args, strings.NewReader(""), &o, &e)
				case 3:
					args, want = []string{"den", "ls", "--json", "--socket", f.socket}, `"name": "box"`
					code = Run(context.Background(), Env{Stdout: &o, Stderr: &e}, args)
				case 4:
					args, want = []string{"den", "checkpoint", "rm", "--help"}, "den checkpoint rm NAME"
					code = Run(context.Background(), Env{Stdout: &o, Stderr: &e, Client: f.client()}, args)
				}
				if code != 0 || e.Len() > 0 || !strings.Contains(o.String(), want) || strings.Count(o.String(), want) != 1 {
					t.Errorf("%q: exit %d, stderr %q, stdout %.200q; want %q once", args, code, e.String(), o.String(), want)
				}
			}
		}()
	}
	wg.Wait()
}

// TestRemoteURL: --url reaches the daemon's TLS listener with --token,
// verified by --ca; bad values are refused before any connection.
func TestRemoteURL(t *testing.T) {
	var got http.Header
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		_ = json.NewEncoder(w).Encode([]api.VM{{Name: "far"}})
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake refused on purpose
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEN_SOCKET", filepath.Join(t.TempDir(), "none.sock"))
	run := func(args ...string) (string, string, int) {
		var o, e bytes.Buffer
		code := Run(context.Background(), Env{Stdout: &o, Stderr: &e}, append([]string{"den"}, args...))
		return o.String(), e.String(), code
	}
	stdout, stderr, code := run("ls", "--url", srv.URL, "--token", "tok", "--ca", ca)
	if code != 0 || !strings.Contains(stdout, "far") || got.Get("Authorization") != "Bearer tok" {
		t.Errorf("ls --url: exit %d, %q, %q, authorization %q", code, stdout, stderr, got.Get("Authorization"))
	}
	t.Setenv("DEN_URL", srv.URL)
	t.Setenv("DEN_TOKEN", "env")
	t.Setenv("DEN_CA", ca)
	if stdout, stderr, code := run("ls", "--json"); code != 0 || !strings.Contains(stdout, "far") || got.Get("Authorization") != "Bearer env" {
		t.Errorf("ls with DEN_URL: exit %d, %q, %q", code, stdout, stderr)
	}
	// Without --ca the system's roots do not know the test server.
	t.Setenv("DEN_CA", "")
	if _, stderr, code := run("ls"); code != 1 || !strings.Contains(stderr, "certificate") {
		t.Errorf("ls without --ca: exit %d, %q; want 1 and a certificate error", code, stderr)
	}
	t.Setenv("DEN_URL", "")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ls", "--url", "http://127.0.0.1:1", "--token", "t"}, 2, `den ls: den api url "http://127.0.0.1:1": want https://HOST:PORT (see den ls --help)`},
		{[]string{"ls", "--url", "https://127.0.0.1:1", "--token="}, 2, "no token"},
		{[]string{"ls", "--url", "https://127.0.0.1:1", "--token", "t", "--ca", filepath.Join(t.TempDir(), "none.pem")}, 1, "den: --ca: open "},
		{[]string{"ls", "--url", "https://127.0.0.1:1", "--token", "t", "--ca", "/dev/null"}, 2, "den ls: --ca /dev/null: no PEM certificate in it"},
	} {
		if _, stderr, code := run(tc.args...); code != tc.code || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("den %q: exit %d, %q; want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}
