package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
)

const token = "s3cret-token"

// fakeBackend dials local test servers for the guest's ports and counts
// the claims Dial hands out and the handler releases.
type fakeBackend struct {
	t       *testing.T
	targets map[string]Target
	ports   map[int]string // guest port → local address
	// hook, if set, runs first in Dial; an error fails the Dial.
	hook func(ctx context.Context) error

	mu       sync.Mutex
	dials    int
	open     int
	released int
}

func (b *fakeBackend) Lookup(_ context.Context, vm string) (Target, error) {
	t, ok := b.targets[vm]
	if !ok {
		return Target{}, fmt.Errorf("vm %s: %w", vm, ErrNotFound)
	}
	return t, nil
}

func (b *fakeBackend) Dial(ctx context.Context, vm string, port int) (net.Conn, func(), error) {
	b.mu.Lock()
	b.dials++
	hook := b.hook
	b.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return nil, nil, err
		}
	}
	addr, ok := b.ports[port]
	if !ok {
		return nil, nil, fmt.Errorf("no port %d in %s", port, vm)
	}
	// Local dials are instant; a hook that blocked may have outlived ctx.
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	b.open++
	b.mu.Unlock()
	var calls int
	release := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		calls++
		if calls > 1 {
			b.t.Errorf("release called %d times for one connection", calls)
			return
		}
		b.open--
		b.released++
	}
	return conn, release, nil
}

func (b *fakeBackend) setHook(hook func(ctx context.Context) error) {
	b.mu.Lock()
	b.hook = hook
	b.mu.Unlock()
}

func (b *fakeBackend) counts() (dials, open, released int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dials, b.open, b.released
}

// waitReleased waits until every claim is released.
func (b *fakeBackend) waitReleased(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, "every claim released", func() bool { _, open, _ := b.counts(); return open == 0 })
}

// seen is what the guest's echo handler saw of a request.
type seen struct {
	Path, RawPath, Query, Host string
	Header                     http.Header
}

func echoGuest(w http.ResponseWriter, r *http.Request) {
	_ = json.NewEncoder(w).Encode(seen{r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Host, r.Header})
}

type fixture struct {
	b     *fakeBackend
	h     *Handler
	front *httptest.Server
	log   *testutil.Buffer
}

// newFixture serves guest as port 8080 of the private VM "box" (token
// above) and of the public VM "pub"; port 8080 of "shut" refuses.
func newFixture(t *testing.T, guest http.Handler) *fixture {
	t.Helper()
	g := httptest.NewServer(guest)
	t.Cleanup(g.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	b := &fakeBackend{
		t: t,
		targets: map[string]Target{
			"box":  {VM: "box", Port: 8080, Token: token},
			"pub":  {VM: "pub", Port: 8080, Public: true},
			"shut": {VM: "shut", Port: 9090, Public: true},
			"bare": {VM: "bare", Port: 8080}, // private without a token: no one gets in
		},
		ports: map[int]string{8080: g.Listener.Addr().String(), 9090: closed},
	}
	log := &testutil.Buffer{}
	h := &Handler{
		Backend: b, Domain: "den.test", WakeTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	front := httptest.NewServer(h)
	t.Cleanup(front.Close)
	return &fixture{b: b, h: h, front: front, log: log}
}

// do sends a request to the front; host "" keeps the server's.
func (f *fixture) do(t *testing.T, method, host, path string, hdr http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, f.front.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c := &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// get sends a request and returns its status and body.
func (f *fixture) get(t *testing.T, host, path string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	resp := f.do(t, http.MethodGet, host, path, hdr)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// getSeen sends a request that must reach the guest and returns what
// the guest saw.
func (f *fixture) getSeen(t *testing.T, host, path string, hdr http.Header) (*http.Response, seen) {
	t.Helper()
	resp, body := f.get(t, host, path, hdr)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s (Host %q): %d %q", path, host, resp.StatusCode, body)
	}
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("guest answer %q: %v", body, err)
	}
	return resp, s
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

func TestHostRouting(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	_, s := f.getSeen(t, "Box.DEN.test:8443", "/a/b?x=1", bearer(token))
	if s.Path != "/a/b" || s.Query != "x=1" {
		t.Errorf("guest saw %q ? %q, want /a/b ? x=1", s.Path, s.Query)
	}
	if s.Host != "Box.DEN.test:8443" || s.Header.Get("X-Forwarded-Host") != "Box.DEN.test:8443" {
		t.Errorf("guest saw Host %q, X-Forwarded-Host %q", s.Host, s.Header.Get("X-Forwarded-Host"))
	}
	if got := s.Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto %q", got)
	}
	if got := s.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q", got)
	}
	if got := s.Header.Get("Authorization"); got != "" {
		t.Errorf("guest got the den token: Authorization %q", got)
	}
	// By host, /vm/ is the guest's own path.
	if _, s = f.getSeen(t, "pub.den.test", "/vm/box/x", nil); s.Path != "/vm/box/x" {
		t.Errorf("guest saw %q, want /vm/box/x", s.Path)
	}
	for _, host := range []string{"a.pub.den.test", "Bad_Name.den.test", "den.den.test"} {
		if resp, body := f.get(t, host, "/", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("Host %s: %d %q, want 404", host, resp.StatusCode, body)
		}
	}
	f.b.waitReleased(t)
}

func TestHostRoutingOff(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	f.h.Domain = ""
	resp, body := f.get(t, "pub.den.test", "/", nil)
	if resp.StatusCode != http.StatusNotFound || body != "den: no vm here; vm URLs look like /vm/VM/\n" {
		t.Errorf("without Domain: %d %q", resp.StatusCode, body)
	}
}

func TestPathRouting(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	for _, tc := range []struct{ path, want, wantRaw, wantQuery string }{
		{"/vm/pub/", "/", "", ""},
		{"/vm/pub/a/b?x=1&y=2", "/a/b", "", "x=1&y=2"},
		{"/vm/pub/a%2Fb/c", "/a/b/c", "/a%2Fb/c", ""},
	} {
		_, s := f.getSeen(t, "", tc.path, nil)
		if s.Path != tc.want || s.RawPath != tc.wantRaw || s.Query != tc.wantQuery {
			t.Errorf("%s: guest saw path %q raw %q query %q, want %q %q %q", tc.path, s.Path, s.RawPath, s.Query, tc.want, tc.wantRaw, tc.wantQuery)
		}
		if got := s.Header.Get("X-Forwarded-Prefix"); got != "/vm/pub" {
			t.Errorf("%s: X-Forwarded-Prefix %q", tc.path, got)
		}
	}
	f.b.waitReleased(t)
}

func TestRedirect(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	resp, _ := f.get(t, "", "/vm/box?den_token=x&a=1", nil)
	if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "/vm/box/?den_token=x&a=1" {
		t.Errorf("got %d Location %q, want 308 /vm/box/?den_token=x&a=1", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func TestNotFound(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	want := "den: no vm here; vm URLs look like http(s)://VM.den.test/ or /vm/VM/\n"
	for _, p := range []string{"/", "/favicon.ico", "/vm", "/vm/", "/vm//x", "/vm/Box/", "/vm/bad_name/", "/vm/den/", "/vm/-a/"} {
		resp, body := f.get(t, "", p, nil)
		if resp.StatusCode != http.StatusNotFound || body != want {
			t.Errorf("%s: %d %q, want 404 %q", p, resp.StatusCode, body, want)
		}
	}
	if d, _, _ := f.b.counts(); d != 0 {
		t.Errorf("%d dials", d)
	}
}

func TestTokenHeader(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	resp, s := f.getSeen(t, "", "/vm/box/", bearer(token))
	if got := s.Header.Get("Authorization"); got != "" {
		t.Errorf("guest got Authorization %q", got)
	}
	if c := resp.Header.Get("Set-Cookie"); c != "" {
		t.Errorf("Set-Cookie %q for a header token", c)
	}
	// An Authorization that is not the den token is the guest's.
	_, s = f.getSeen(t, "", "/vm/box/", http.Header{"Authorization": {"Basic YTpi"}, "Cookie": {"den_token=" + token}})
	if got := s.Header.Get("Authorization"); got != "Basic YTpi" {
		t.Errorf("guest got Authorization %q, want the client's own", got)
	}
	// So is any Authorization sent to a public VM.
	_, s = f.getSeen(t, "", "/vm/pub/", bearer("app-token"))
	if got := s.Header.Get("Authorization"); got != "Bearer app-token" {
		t.Errorf("public guest got Authorization %q", got)
	}
	f.b.waitReleased(t)
}

// TestTokenQuery: a token in the query sets the cookie and is taken
// out of the address bar by a redirect (GET, HEAD); other methods go on
// to the guest without it.
func TestTokenQuery(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	for _, tc := range []struct{ host, path, cookiePath, location string }{
		{"", "/vm/box/p?a=1&den_token=" + token + "&b=2", "/vm/box/", "/vm/box/p?a=1&b=2"},
		{"box.den.test", "/?den_token=" + token, "/", "/"},
		{"box.den.test", "/a%2Fb?den_token=" + token + "&x", "/", "/a%2Fb?x"},
	} {
		resp, _ := f.get(t, tc.host, tc.path, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != tc.location {
			t.Errorf("%s: %d Location %q, want 303 %q", tc.path, resp.StatusCode, resp.Header.Get("Location"), tc.location)
		}
		if got, want := resp.Header.Get("Set-Cookie"), "den_token="+token+"; Path="+tc.cookiePath+"; HttpOnly; SameSite=Lax"; got != want {
			t.Errorf("%s: Set-Cookie %q, want %q", tc.path, got, want)
		}
		if got := resp.Header.Get("Referrer-Policy"); got != "no-referrer" {
			t.Errorf("%s: Referrer-Policy %q", tc.path, got)
		}
	}
	if d, _, _ := f.b.counts(); d != 0 {
		t.Errorf("%d dials for redirects", d)
	}
	// The redirect's target, with the cookie, reaches the guest.
	_, s := f.getSeen(t, "", "/vm/box/p?a=1&b=2", http.Header{"Cookie": {"den_token=" + token}})
	if s.Query != "a=1&b=2" || s.Path != "/p" {
		t.Errorf("guest saw %q ? %q, want /p ? a=1&b=2", s.Path, s.Query)
	}
	// A POST is not redirected (its body would be lost): it goes on
	// without the token.
	resp := f.do(t, http.MethodPost, "", "/vm/box/p?den_token="+token+"&b=2", nil)
	defer resp.Body.Close()
	var seenPost seen
	if err := json.NewDecoder(resp.Body).Decode(&seenPost); err != nil || resp.StatusCode != 200 || seenPost.Query != "b=2" {
		t.Errorf("POST with the token in the query: %d %+v %v", resp.StatusCode, seenPost, err)
	}
	f.b.waitReleased(t)
}

// TestRefererAcrossVMs: a Referer from another VM's URL never reaches a
// VM (path URLs share one origin, so browsers send it); one from the
// VM's own URL or from elsewhere does, without den_token.
func TestRefererAcrossVMs(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	front := strings.TrimPrefix(f.front.URL, "http://")
	for _, tc := range []struct{ host, path, referer, want string }{
		{"", "/vm/box/", "http://" + front + "/vm/pub/page?den_token=" + token, ""},
		{"", "/vm/box/", "http://" + front + "/vm/other/", ""},
		{"", "/vm/box/", "http://" + front + "/vm/box/a?den_token=" + token + "&z=1", "http://" + front + "/vm/box/a?z=1"},
		{"", "/vm/box/", "https://example.com/?q=1", "https://example.com/?q=1"},
		{"box.den.test", "/", "http://pub.den.test/x?den_token=" + token, ""},
		{"box.den.test", "/", "http://box.den.test/x?den_token=" + token, "http://box.den.test/x"},
		{"box.den.test", "/", "http://example.com/vm/pub/", "http://example.com/vm/pub/"},
	} {
		hdr := bearer(token)
		hdr.Set("Referer", tc.referer)
		_, s := f.getSeen(t, tc.host, tc.path, hdr)
		if got := s.Header.Get("Referer"); got != tc.want {
			t.Errorf("Referer %q to %s%s: guest saw %q, want %q", tc.referer, tc.host, tc.path, got, tc.want)
		}
	}
	f.b.waitReleased(t)
}

// TestSetCookieFiltered: a VM cannot set den's cookie, nor cookies for
// another VM's path or for the domain every VM's host shares.
func TestSetCookieFiltered(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, c := range []string{
			"app=1; Path=/vm/box/", "plain=1", "exact=1; Path=/vm/box",
			"den_token=evil; Path=/vm/pub/", "DEN_TOKEN=evil",
			"steal=1; Path=/vm/pub/", "wide=1; Path=/", "near=1; Path=/vm/boxer/",
			"dom=1; Domain=den.test", "own=1; Domain=box.den.test", "junk",
		} {
			w.Header().Add("Set-Cookie", c)
		}
	}))
	names := func(resp *http.Response) string {
		var n []string
		for _, c := range resp.Cookies() {
			n = append(n, c.Name)
		}
		return strings.Join(n, ",")
	}
	resp, _ := f.get(t, "", "/vm/box/", bearer(token))
	if got := names(resp); got != "app,plain,exact" {
		t.Errorf("by path: cookies %q, want app,plain,exact", got)
	}
	resp, _ = f.get(t, "box.den.test", "/", bearer(token))
	if got := names(resp); got != "app,plain,exact,steal,wide,near,own" {
		t.Errorf("by host: cookies %q", got)
	}
	if !strings.Contains(f.log.String(), "cookies refused") {
		t.Errorf("refusals not logged: %s", f.log.String())
	}
	f.b.waitReleased(t)
}

// TestDenAnswersNoReferrer: den's own answers send no Referer on.
func TestDenAnswersNoReferrer(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	for _, p := range []string{"/vm/box/", "/nowhere", "/vm/box", "/vm/shut/"} {
		resp, _ := f.get(t, "", p, nil)
		if got := resp.Header.Get("Referrer-Policy"); got != "no-referrer" {
			t.Errorf("%s (%d): Referrer-Policy %q", p, resp.StatusCode, got)
		}
	}
}

// TestCut: Cut closes the streams open to a VM's port, and a request let
// in before it cannot open one after it; other VMs' streams stay.
func TestCut(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "tick %d\n", i); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	open := func(path string, hdr http.Header) *bufio.Reader {
		resp := f.do(t, http.MethodGet, "", path, hdr)
		t.Cleanup(func() { resp.Body.Close() })
		br := bufio.NewReader(resp.Body)
		if l, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(l, "tick") {
			t.Fatalf("%s: %d %q %v", path, resp.StatusCode, l, err)
		}
		return br
	}
	box := open("/vm/box/", bearer(token))
	pub := open("/vm/pub/", nil)
	if n := f.h.Cut("box"); n != 1 {
		t.Errorf("Cut closed %d streams, want 1", n)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := box.ReadString('\n'); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("box's stream still open 10 s after Cut")
	}
	if l, err := pub.ReadString('\n'); err != nil || !strings.HasPrefix(l, "tick") {
		t.Errorf("pub's stream after box's cut: %q %v", l, err)
	}
	// A request that passed its token check before Cut, still waking the
	// VM when it came, gets no stream.
	entered, cut := make(chan struct{}), make(chan struct{})
	f.b.setHook(func(context.Context) error { close(entered); <-cut; return nil })
	done := make(chan *http.Response, 1)
	go func() { done <- f.do(t, http.MethodGet, "", "/vm/box/", bearer(token)) }()
	<-entered
	f.h.Cut("box")
	close(cut)
	resp := <-done
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("a stream opened across Cut: %d", resp.StatusCode)
	}
	f.b.setHook(nil)
	if n := f.h.Cut("pub"); n != 1 {
		t.Errorf("Cut(pub) closed %d, want 1", n)
	}
	f.b.waitReleased(t)
}

func TestTokenCookie(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	_, s := f.getSeen(t, "", "/vm/box/", http.Header{"Cookie": {"a=1; den_token=" + token + "; b=2"}})
	if got := s.Header.Get("Cookie"); got != "a=1; b=2" {
		t.Errorf("guest got Cookie %q, want a=1; b=2", got)
	}
	_, s = f.getSeen(t, "", "/vm/box/", http.Header{"Cookie": {"den_token=" + token}})
	if got := s.Header.Values("Cookie"); len(got) != 0 {
		t.Errorf("guest got Cookie %q", got)
	}
	f.b.waitReleased(t)
}

func TestDeniedLooksTheSame(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	for _, tc := range []struct {
		name, path string
		hdr        http.Header
	}{
		{"no token", "/vm/box/", nil},
		{"wrong bearer", "/vm/box/", bearer("nope")},
		{"wrong query", "/vm/box/?den_token=nope", nil},
		{"wrong cookie", "/vm/box/", http.Header{"Cookie": {"den_token=nope"}}},
		{"empty bearer", "/vm/box/", http.Header{"Authorization": {"Bearer "}}},
		{"another vm's token", "/vm/bare/", bearer(token)},
		{"private without a token", "/vm/bare/", http.Header{"Authorization": {"Bearer "}}},
		{"unknown vm", "/vm/nosuch/", nil},
		{"unknown vm with a token", "/vm/nosuch/?den_token=" + token, bearer(token)},
		{"unknown vm by host", "/", nil},
	} {
		host := ""
		if tc.name == "unknown vm by host" {
			host = "nosuch.den.test"
		}
		resp, body := f.get(t, host, tc.path, tc.hdr)
		if resp.StatusCode != http.StatusUnauthorized || body != msgUnauthorized+"\n" {
			t.Errorf("%s: %d %q, want 401 %q", tc.name, resp.StatusCode, body, msgUnauthorized)
		}
		if c := resp.Header.Get("Set-Cookie"); c != "" {
			t.Errorf("%s: Set-Cookie %q", tc.name, c)
		}
	}
	if d, _, _ := f.b.counts(); d != 0 {
		t.Errorf("%d dials for denied requests", d)
	}
}

func TestPublic(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	f.getSeen(t, "", "/vm/pub/", nil)
	f.getSeen(t, "pub.den.test", "/", nil)
	f.b.waitReleased(t)
	if want := "vm=pub method=GET path=/vm/pub/ status=200 duration="; !strings.Contains(f.log.String(), want) {
		t.Errorf("log %q lacks %q", f.log.String(), want)
	}
	if d, _, r := f.b.counts(); d != 2 || r != 2 {
		t.Errorf("%d dials, %d releases; want 2, 2 (one claim per request)", d, r)
	}
}

func TestRefused(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	resp, body := f.get(t, "", "/vm/shut/", nil)
	if want := "den: nothing listens on port 9090 in vm shut\n"; resp.StatusCode != http.StatusBadGateway || body != want {
		t.Errorf("got %d %q, want 502 %q", resp.StatusCode, body, want)
	}
	// The guest's agent reports a refusal over SSH as a message.
	f.b.setHook(func(context.Context) error {
		return errors.New("ssh: rejected: connect failed (dial tcp 127.0.0.1:8080: connect: connection refused)")
	})
	resp, body = f.get(t, "", "/vm/pub/", nil)
	if want := "den: nothing listens on port 8080 in vm pub\n"; resp.StatusCode != http.StatusBadGateway || body != want {
		t.Errorf("got %d %q, want 502 %q", resp.StatusCode, body, want)
	}
	f.b.setHook(func(context.Context) error { return errors.New("vm is being deleted") })
	resp, body = f.get(t, "", "/vm/pub/", nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "vm is being deleted") {
		t.Errorf("got %d %q, want 502 with the error", resp.StatusCode, body)
	}
	if _, open, _ := f.b.counts(); open != 0 {
		t.Errorf("%d claims open", open)
	}
}

func TestWakeTimeout(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(echoGuest))
	f.h.WakeTimeout = 100 * time.Millisecond
	f.b.setHook(func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	resp, body := f.get(t, "", "/vm/pub/", nil)
	if want := "den: vm pub did not answer within 100ms\n"; resp.StatusCode != http.StatusGatewayTimeout || body != want {
		t.Errorf("got %d %q, want 504 %q", resp.StatusCode, body, want)
	}

	// A Dial that does not heed its context is answered in time too,
	// and its late connection is closed and its claim released.
	unblock := make(chan struct{})
	f.b.setHook(func(context.Context) error {
		<-unblock
		return nil
	})
	resp, body = f.get(t, "", "/vm/pub/", nil)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("got %d %q, want 504", resp.StatusCode, body)
	}
	close(unblock)
	testutil.WaitFor(t, "the late claim released", func() bool { _, open, released := f.b.counts(); return open == 0 && released == 1 })
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{60 * time.Second: "60s", 90 * time.Second: "90s", 1500 * time.Millisecond: "1.5s"} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %q, want %q", d, got, want)
		}
	}
	if (&Handler{}).wakeTimeout() != 60*time.Second {
		t.Error("default WakeTimeout is not 60s")
	}
}

func TestStreaming(t *testing.T) {
	next := make(chan struct{})
	guest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	})
	f := newFixture(t, guest)
	resp := f.do(t, http.MethodGet, "", "/vm/box/events", bearer(token))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := 1; i <= 3; i++ {
		// The guest writes chunk i+1 only once the test has chunk i:
		// a proxy that buffered would never deliver it.
		line, err := br.ReadString('\n')
		if want := fmt.Sprintf("chunk %d\n", i); err != nil || line != want {
			t.Fatalf("read %q, %v; want %q", line, err, want)
		}
		if _, open, _ := f.b.counts(); open != 1 {
			t.Fatalf("after chunk %d: %d claims open, want 1", i, open)
		}
		next <- struct{}{}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the last chunk: %q, %v", rest, err)
	}
	f.b.waitReleased(t)
	if d, _, r := f.b.counts(); d != 1 || r != 1 {
		t.Errorf("%d dials, %d releases; want 1, 1", d, r)
	}
}

func TestUpgrade(t *testing.T) {
	guest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		if r.Header.Get("Authorization") != "" || r.URL.Path != "/ws" {
			http.Error(w, "den's path or token leaked", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			brw.WriteString("echo " + line)
			brw.Flush()
		}
	})
	f := newFixture(t, guest)
	conn, err := net.Dial("tcp", f.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /vm/box/ws HTTP/1.1\r\nHost: den.test\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", token)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("got %d %q, want 101", resp.StatusCode, body)
	}
	for _, msg := range []string{"hello\n", "again\n"} {
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		line, err := br.ReadString('\n')
		if err != nil || line != "echo "+msg {
			t.Fatalf("read %q, %v; want %q", line, err, "echo "+msg)
		}
		if _, open, _ := f.b.counts(); open != 1 {
			t.Fatalf("%d claims open while the connection is, want 1", open)
		}
	}
	conn.Close()
	f.b.waitReleased(t)
	testutil.WaitFor(t, "the request logged", func() bool { return strings.Contains(f.log.String(), "path=/vm/box/ws status=101") })
	if d, _, r := f.b.counts(); d != 1 || r != 1 {
		t.Errorf("%d dials, %d releases; want 1, 1", d, r)
	}
}
