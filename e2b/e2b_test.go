package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/api"
)

func TestSandboxOf(t *testing.T) {
	for _, c := range []struct {
		host    string
		headers map[string]string
		id      string
		port    int
		ok      bool
	}{
		{"127.0.0.1:3000", map[string]string{"E2b-Sandbox-Id": "ibox", "E2b-Sandbox-Port": "49983"}, "ibox", 49983, true},
		{"127.0.0.1:3000", map[string]string{"E2b-Sandbox-Id": "ibox"}, "ibox", EnvdPort, true},
		{"127.0.0.1:3000", map[string]string{"E2b-Sandbox-Id": "ibox", "E2b-Sandbox-Port": "x"}, "ibox", 0, true},
		{"49983-ibox.den.example:443", nil, "ibox", 49983, true},
		{"8080-my-box.den.example", nil, "my-box", 8080, true},
		{"api.den.example", nil, "", 0, false},
		{"127.0.0.1:3000", nil, "", 0, false},
		{"localhost:3000", nil, "", 0, false},
		{"70000-ibox.den.example", nil, "", 0, false},
		{"10-0-0-5.sslip.io", nil, "", 0, false},
		{"8080-bad_name.den.example", nil, "", 0, false},
	} {
		r := httptest.NewRequest("GET", "http://"+c.host+"/health", nil)
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		id, port, ok := sandboxOf(r)
		if id != c.id || port != c.port || ok != c.ok {
			t.Errorf("%s %v: %q %d %v, want %q %d %v", c.host, c.headers, id, port, ok, c.id, c.port, c.ok)
		}
	}
}

func TestParseFilter(t *testing.T) {
	// As the SDK sends them: metadata is an encoded query string.
	q, _ := url.ParseQuery("metadata=suite%3Dden-e2e%26run%3D1%2520b&state=running,paused")
	f, err := parseFilter(q)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.states, []string{"running", "paused"}) || !reflect.DeepEqual(f.metadata, map[string]string{"suite": "den-e2e", "run": "1 b"}) {
		t.Errorf("filter: %+v", f)
	}
	if !f.keeps(sandboxDetail{State: "paused", Metadata: map[string]string{"suite": "den-e2e", "run": "1 b", "x": "y"}}) {
		t.Error("a matching sandbox is not kept")
	}
	if f.keeps(sandboxDetail{State: "running", Metadata: map[string]string{"suite": "den-e2e"}}) {
		t.Error("a sandbox without run=1 b is kept")
	}
	if _, err := parseFilter(url.Values{"state": {"sleeping"}}); err == nil {
		t.Error("state sleeping is taken")
	}
}

func TestOnTimeout(t *testing.T) {
	for _, c := range []struct {
		rec    record
		asleep bool
		want   timeoutAction
	}{
		{record{}, false, kill},
		{record{}, true, kill}, // den's idle sleep does not spare it
		{record{AutoPause: true}, false, pause},
		{record{AutoPause: true}, true, pauseAsleep},
		{record{AutoPause: true, Paused: true}, true, noEnd},
		{record{Paused: true}, true, noEnd},
		{record{Paused: true}, false, kill}, // resumed by den's means, then timed out
	} {
		if got := onTimeout(c.rec, c.asleep); got != c.want {
			t.Errorf("onTimeout(%+v, asleep %v) = %v, want %v", c.rec, c.asleep, got, c.want)
		}
	}
}

func TestEgressOf(t *testing.T) {
	for _, c := range []struct {
		body string
		want string
		err  bool
	}{
		{`{}`, "", false},
		{`{"allow_internet_access":true}`, "", false},
		{`{"allow_internet_access":false}`, "deny-all", false},
		{`{"network":{"denyOut":["0.0.0.0/0"]}}`, "deny-all", false},
		{`{"network":{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1","example.org"]}}`, "allow:1.1.1.1,example.org", false},
		{`{"network":{"denyOut":["10.0.0.0/8","169.254.169.254"]}}`, "deny:10.0.0.0/8,169.254.169.254", false},
		{`{"network":{"denyOut":["10.0.0.0/8"],"allowOut":["10.1.2.3","example.org"]}}`, "deny:10.0.0.0/8;allow:10.1.2.3,example.org", false},
		{`{"allow_internet_access":false,"network":{"denyOut":["10.0.0.0/8"],"allowOut":["10.1.2.3"]}}`, "allow:10.1.2.3", false},
		{`{"network":{"allowOut":["10.1.2.3"]}}`, "", false},
		{`{"network":{"allowOut":["example.org"]}}`, "", true},
		{`{"network":{"denyOut":["example.org"]}}`, "", true},
		{`{"network":{"denyOut":["10.0.0.1/8"]}}`, "", true},
		{`{"network":{"denyOut":["0.0.0.0/0","bad..name"],"allowOut":["1.1.1.1"]}}`, "", true},
		{`{"network":{"egressProxy":{"address":"p:1080"}}}`, "", true},
	} {
		var b newSandbox
		if err := json.Unmarshal([]byte(c.body), &b); err != nil {
			t.Fatal(err)
		}
		got, err := egressOf(b)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%s: %q %v", c.body, got, err)
		}
	}
}

// The messages as the SDK's protobuf JSON writes and reads them.
func TestWire(t *testing.T) {
	var start startRequest
	in := `{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"tag":"t"}`
	if err := (jsonCodec{}).Unmarshal([]byte(in), &start); err != nil {
		t.Fatal(err)
	}
	if start.Process.Cmd != "/bin/bash" || len(start.Process.Args) != 3 || *start.Process.Cwd != "/tmp" || *start.Stdin || *start.Tag != "t" || start.Process.Envs["A"] != "1" {
		t.Errorf("start: %+v", start)
	}
	var sig sendSignalRequest
	if err := json.Unmarshal([]byte(`{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}`), &sig); err != nil || *sig.Process.PID != 42 || signals[sig.Signal.Name] != 9 {
		t.Errorf("signal by name: %+v %v", sig, err)
	}
	if err := json.Unmarshal([]byte(`{"process":{"tag":"x"},"signal":15}`), &sig); err != nil || sig.Signal.Number != 15 || *sig.Process.Tag != "x" {
		t.Errorf("signal by number: %+v %v", sig, err)
	}
	for _, c := range []struct {
		ev   processEvent
		want string
	}{
		{processEvent{Start: &startEvent{PID: 7}}, `{"start":{"pid":7}}`},
		{processEvent{Data: &dataEvent{Stdout: []byte("hi\n")}}, `{"data":{"stdout":"aGkK"}}`},
		{processEvent{End: &endEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}}, `{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}`},
		{processEvent{Keepalive: &struct{}{}}, `{"keepalive":{}}`},
	} {
		got, _ := (jsonCodec{}).Marshal(&c.ev)
		if string(got) != c.want {
			t.Errorf("event: %s, want %s", got, c.want)
		}
	}
	got, _ := json.Marshal(entryInfo{Name: "a", Type: fileTypeFile, Path: "/a", Size: 5})
	if !strings.Contains(string(got), `"size":"5"`) || !strings.Contains(string(got), `"type":"FILE_TYPE_FILE"`) || !strings.Contains(string(got), `"modifiedTime":"0001-01-01T00:00:00Z"`) {
		t.Errorf("entry: %s", got)
	}
}

// The pid marker line is taken out of the stream that carries it, and
// output waits for the pid.
func TestOutputPID(t *testing.T) {
	p := &proc{started: make(chan struct{}), subs: map[*sub]struct{}{}}
	s := p.subscribe()
	var pid uint32
	onPID := func(n uint32) { pid = n; close(p.started) }
	errOut := &output{p: p, kind: "stderr", sniff: true, onPID: onPID}
	done := make(chan struct{})
	go func() {
		defer close(done)
		errOut.Write([]byte(pidMarker + "12"))
		errOut.Write([]byte("34\nwarning\n"))
	}()
	ev := <-s.ch
	<-done
	if pid != 1234 || string(ev.Data.Stderr) != "warning\n" {
		t.Errorf("pid %d, first stderr %q", pid, ev.Data.Stderr)
	}
	// A stream whose first line is not the marker keeps it.
	p2 := &proc{started: make(chan struct{}), subs: map[*sub]struct{}{}}
	s2 := p2.subscribe()
	out := &output{p: p2, kind: "pty", sniff: true, onPID: func(n uint32) { pid = n; close(p2.started) }}
	go out.Write([]byte("no marker\r\nmore"))
	if ev := <-s2.ch; pid != 0 || string(ev.Data.PTY) != "no marker\nmore" {
		t.Errorf("pid %d, pty %q", pid, ev.Data.PTY)
	}
}

// Calls without a valid key, and calls den does not serve, answer in
// E2B's error shape.
func TestErrorShape(t *testing.T) {
	srv, err := New(Config{
		Authenticate: func(context.Context, string) (*api.Client, string, error) {
			return nil, "", errors.New("no")
		},
		Records: filepath.Join(t.TempDir(), "e2b.json"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path, key string
		headers           map[string]string
		status            int
		says              string
	}{
		{"GET", "/v2/sandboxes", "", nil, 401, "no API key"},
		{"POST", "/v2/sandboxes", "den_x", nil, 401, "not a valid den token"},
		{"POST", "/v3/templates", "", nil, 501, "den image"},
		{"GET", "/teams", "", nil, 501, "den tokens"},
		{"GET", "/sandboxes/ibox/metrics", "", nil, 401, "no API key"},
		{"GET", "/sandboxes/metrics?sandbox_ids=ibox", "", nil, 401, "no API key"},
		{"GET", "/v2/sandboxes/ibox/logs", "", nil, 401, "no API key"},
		{"GET", "/sandboxes/ibox/logs", "", nil, 401, "no API key"},
		{"GET", "/nope", "", nil, 404, "not an E2B call"},
		{"GET", "/", "", map[string]string{"E2b-Sandbox-Id": "ibox", "E2b-Sandbox-Port": "3000"}, 404, "den url"},
		{"GET", "/", "", map[string]string{"E2b-Sandbox-Id": "ibox", "E2b-Sandbox-Port": "x"}, 404, "not found"},
		{"POST", "/filesystem.Filesystem/NoSuch", "", map[string]string{"E2b-Sandbox-Id": "ibox"}, 404, "not an envd call"},
	} {
		r := httptest.NewRequest(c.method, c.path, strings.NewReader("{}"))
		if c.key != "" {
			r.Header.Set("X-API-KEY", c.key)
		}
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		var e apiError
		if w.Code != c.status || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != c.status || !strings.Contains(e.Message, c.says) ||
			w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s", c.method, c.path, w.Code, w.Body)
		}
	}
}

func TestChanges(t *testing.T) {
	t0 := time.Unix(1000, 0)
	before := map[string]seen{
		"kept":    {size: 1, mtime: t0, mode: 0o644},
		"grown":   {size: 1, mtime: t0, mode: 0o644},
		"chmoded": {size: 1, mtime: t0, mode: 0o644},
		"gone":    {size: 1, mtime: t0, mode: 0o644},
		"sub":     {dir: true, mtime: t0, mode: fs.ModeDir | 0o755},
	}
	after := map[string]seen{
		"kept":      {size: 1, mtime: t0, mode: 0o644},
		"grown":     {size: 2, mtime: t0.Add(time.Second), mode: 0o644},
		"chmoded":   {size: 1, mtime: t0, mode: 0o600},
		"sub":       {dir: true, mtime: t0.Add(time.Second), mode: fs.ModeDir | 0o755},
		"sub/new":   {size: 3, mtime: t0, mode: 0o644},
		"sub/empty": {mtime: t0, mode: 0o644},
	}
	want := []fsEvent{
		{"chmoded", "EVENT_TYPE_CHMOD"}, {"grown", "EVENT_TYPE_WRITE"},
		{"sub/empty", "EVENT_TYPE_CREATE"}, {"sub/new", "EVENT_TYPE_CREATE"}, {"sub/new", "EVENT_TYPE_WRITE"},
		{"gone", "EVENT_TYPE_REMOVE"},
	}
	if got := changes(before, after); !reflect.DeepEqual(got, want) {
		t.Errorf("changes:\n%v\nwant\n%v", got, want)
	}
}

// TestMetricsInterval: the start and end of a metrics call are Unix
// seconds, in order.
func TestMetricsInterval(t *testing.T) {
	for q, ok := range map[string]bool{
		"": true, "start=10": true, "start=10&end=20": true, "end=5": true,
		"start=x": false, "start=-1": false, "start=20&end=10": false,
	} {
		_, _, err := interval(httptest.NewRequest("GET", "/sandboxes/a/metrics?"+q, nil))
		if (err == nil) != ok {
			t.Errorf("%q: %v", q, err)
		}
	}
}

func TestAccountPaths(t *testing.T) {
	alice := account{name: "alice", uid: 1000, gid: 1000, home: "/home/alice"}
	for _, c := range []struct {
		a    account
		in   string
		want string
	}{
		{rootAccount, "", "/root"},
		{rootAccount, "a.txt", "/root/a.txt"},
		{alice, "", "/home/alice"},
		{alice, "~", "/home/alice"},
		{alice, "~/x/../y", "/home/alice/y"},
		{alice, "notes.txt", "/home/alice/notes.txt"},
		{alice, "/etc/hostname", "/etc/hostname"},
		{alice, "../../etc", "/etc"},
	} {
		if got := c.a.abs(c.in); got != c.want {
			t.Errorf("%s: abs(%q) = %q, want %q", c.a.name, c.in, got, c.want)
		}
	}
}

func TestUserOf(t *testing.T) {
	for _, c := range []struct {
		header, user string
		bad          bool
	}{
		{"", "", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("alice:")), "alice", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("root:")), "root", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("Robert'); drop:")), "", true},
		{"Basic !!!", "", true},
		{"Bearer x", "", false},
	} {
		h := http.Header{}
		if c.header != "" {
			h.Set("Authorization", c.header)
		}
		user, err := userOf(h)
		if (err != nil) != c.bad || !c.bad && user != c.user {
			t.Errorf("%q: %q %v", c.header, user, err)
		}
	}
}

func TestJournalBounded(t *testing.T) {
	j := newJournal()
	for i := range maxLogs + 10 {
		j.add("ibox", "info", fmt.Sprint(i))
	}
	got := j.entries("ibox")
	if len(got) != maxLogs || got[0].Message != "10" || got[len(got)-1].Fields["sandboxID"] != "ibox" {
		t.Fatalf("%d entries, first %q", len(got), got[0].Message)
	}
	j.forget("ibox")
	if len(j.entries("ibox")) != 0 {
		t.Fatal("forgotten entries left")
	}
}
