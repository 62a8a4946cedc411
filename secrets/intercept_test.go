package secrets

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
)

// upstreamHTTPS is a TLS server on addr:443 with a CA of its own for the
// names api.test and other.test; it answers each request with what it
// got: "AUTH <Authorization> QUERY <raw query>".
func upstreamHTTPS(t *testing.T, addr string) *x509.CertPool {
	t.Helper()
	ca, _, err := newCA("upstream")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.leaf("other.test")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", addr+":443")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "AUTH %s QUERY %s HOST %s", r.Header.Get("Authorization"), r.URL.RawQuery, r.Host)
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{*leaf, *other}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// freeAddr is a free TCP port on addr.
func freeAddr(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// TestInterceptor: a VM's HTTPS request to a host of a secret granted to
// it reaches the real host (its certificate verified) with the value in
// place of the placeholder, in the named header or query parameter;
// other hosts and other VMs get nothing; a new value and a revoke count
// at once; each use is noted, and so is a placeholder sent as it is.
func TestInterceptor(t *testing.T) {
	testutil.NeedRoot(t, "a test server on port 443 of a loopback address")
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	const real = "127.0.86.1"
	roots := upstreamHTTPS(t, real)
	if _, err := s.AddHTTPS("alice", "api", []byte("Bearer tok-1"), HTTPS{Hosts: []string{"API.test."}, Header: "authorization"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddHTTPS("alice", "qkey", []byte("k&1 2"), HTTPS{Hosts: []string{"api.test"}, Query: "key", Env: "Q_KEY"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddHTTPS("alice", "elsewhere", []byte("nope"), HTTPS{Hosts: []string{"other.test"}, Header: "Authorization"}); err != nil {
		t.Fatal(err)
	}
	box := VMRef{Name: "box", Created: time.UnixMilli(1000)}
	twin := VMRef{Name: "twin", Created: time.UnixMilli(2000)}
	for _, g := range []string{"api", "qkey"} {
		if err := s.Grant("alice", g, box); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var notes []string
	ix := s.NewInterceptor(InterceptorConfig{
		VM: func(name string) (VMRef, error) {
			switch name {
			case "box":
				return box, nil
			case "twin":
				return twin, nil
			}
			return VMRef{}, errors.New("no such vm")
		},
		Roots: roots,
		Note: func(u Use) {
			mu.Lock()
			defer mu.Unlock()
			notes = append(notes, fmt.Sprintf("%s %s %s %v", u.VM, u.Secret, u.Dest, u.Err))
		},
	})
	t.Cleanup(ix.Close)
	resolve := func(_ context.Context, name string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr(real)}, nil
	}
	addrs := map[string]netip.AddrPort{}
	for _, vm := range []string{"box", "twin"} {
		addrs[vm] = freeAddr(t, "127.0.0.1")
		if err := ix.Serve(vm, addrs[vm], netip.MustParseAddr("127.0.0.1"), resolve); err != nil {
			t.Fatal(err)
		}
	}
	// The VM's client: every name leads to its interceptor, and it
	// trusts its own CA only.
	client := func(vm VMRef) *http.Client {
		ca, err := s.VMCA(vm)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca.PEM)
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addrs[vm.Name].String())
			},
		}}
	}
	get := func(c *http.Client, url, auth string) (string, error) {
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}

	if !ix.Intercepts("box", "api.test") || ix.Intercepts("box", "other.test") || ix.Intercepts("twin", "api.test") {
		t.Fatal("Intercepts does not follow the grants")
	}
	c := client(box)
	got, err := get(c, "https://api.test/v1/x?a=1&key=den-secret:qkey&z=%20", "den-secret:api-v2 den-secret:api")
	if err != nil || got != "200 AUTH den-secret:api-v2 Bearer tok-1 QUERY a=1&key=k%261+2&z=%20 HOST api.test" {
		t.Fatalf("a granted request: %q %v", got, err)
	}
	// No session is resumed: each handshake's name is checked.
	tc := c.Transport.(*http.Transport)
	tc.TLSClientConfig.ClientSessionCache = tls.NewLRUClientSessionCache(8)
	for range 2 {
		tc.CloseIdleConnections()
		resp, err := c.Get("https://api.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.TLS.DidResume {
			t.Fatal("a tls session was resumed")
		}
	}
	// Only the guest's address is served.
	far := freeAddr(t, "127.0.0.1")
	if err := ix.Serve("far", far, netip.MustParseAddr("127.0.0.2"), resolve); err != nil {
		t.Fatal(err)
	}
	if conn, err := tls.Dial("tcp", far.String(), &tls.Config{ServerName: "api.test", InsecureSkipVerify: true}); err == nil {
		conn.Close()
		t.Fatal("a connection from another address than the guest's was served")
	}
	// A name den does not take: no certificate.
	if _, err := get(c, "https://other.test/", "den-secret:elsewhere"); err == nil {
		t.Fatal("den ended TLS for a name no grant of the vm names")
	}
	// A request for another host over api.test's connection.
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	req.Host = "other.test"
	req.Header.Set("Authorization", "den-secret:api")
	if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a request for another host: %v %v", resp, err)
	}
	// Another VM: no grant, and its connection is not taken.
	if _, err := get(client(twin), "https://api.test/", "den-secret:api"); err == nil {
		t.Fatal("a vm without a grant had its connection taken")
	}
	// A new value counts at once.
	if _, err := s.Set("alice", "api", []byte("Bearer tok-2")); err != nil {
		t.Fatal(err)
	}
	if got, err := get(c, "https://api.test/", "den-secret:api"); err != nil || !strings.HasPrefix(got, "200 AUTH Bearer tok-2 ") {
		t.Fatalf("after set: %q %v", got, err)
	}
	// A revoke too: the placeholder goes as it is, and is noted.
	if _, err := s.Revoke("alice", "api", box); err != nil {
		t.Fatal(err)
	}
	if got, err := get(c, "https://api.test/p", "den-secret:api"); err != nil || !strings.HasPrefix(got, "200 AUTH den-secret:api ") {
		t.Fatalf("after revoke: %q %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"box api GET https://api.test/v1/x: 200 <nil>",
		"box qkey GET https://api.test/v1/x: 200 <nil>",
		"box api-v2 GET https://api.test/v1/x: 200 den-secret:api-v2 went as it is: vm box has no grant of it for api.test",
		"box api GET https://api.test/: 200 <nil>",
		"box api GET https://api.test/p: 200 den-secret:api went as it is: vm box has no grant of it for api.test",
	}
	if strings.Join(notes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("notes:\n%s\nwant:\n%s", strings.Join(notes, "\n"), strings.Join(want, "\n"))
	}
	for _, v := range []string{"tok-1", "tok-2"} {
		if strings.Contains(strings.Join(notes, ""), v) {
			t.Fatal("a value is in the notes")
		}
	}
}

// TestAddHTTPS: what an HTTPS secret must say, and what it may not.
func TestAddHTTPS(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	if s.AnyHTTPS() {
		t.Fatal("an empty store holds an https secret")
	}
	sec, err := s.AddHTTPS("alice", "open-ai.key", []byte("sk-1"), HTTPS{Hosts: []string{"Api.OpenAI.com", "api.openai.com"}, Header: "x-api-key"})
	if err != nil || sec.Env != "OPEN_AI_KEY" || sec.Header != "X-Api-Key" || len(sec.Hosts) != 1 || sec.Hosts[0] != "api.openai.com" {
		t.Fatalf("%+v %v", sec, err)
	}
	for _, c := range []struct {
		value string
		h     HTTPS
	}{
		{"v", HTTPS{Header: "A"}},                                        // no host
		{"v", HTTPS{Hosts: []string{"a.test"}}},                          // no header nor query
		{"v", HTTPS{Hosts: []string{"a.test"}, Header: "A", Query: "q"}}, // both
		{"v", HTTPS{Hosts: []string{"*.a.test"}, Header: "A"}},           // wildcard
		{"v", HTTPS{Hosts: []string{"a.test:443"}, Header: "A"}},         // port
		{"v", HTTPS{Hosts: []string{"a.test"}, Header: "Host"}},          // the Host header
		{"v", HTTPS{Hosts: []string{"a.test"}, Header: "A b"}},           // bad header
		{"v", HTTPS{Hosts: []string{"a.test"}, Query: "a&b"}},            // bad parameter
		{"v", HTTPS{Hosts: []string{"a.test"}, Header: "A", Env: "1X"}},  // bad variable
		{"v", HTTPS{Hosts: []string{"a.test"}, Header: "A", Env: "PATH"}},
		{"v", HTTPS{Hosts: []string{"a.test"}, Header: "A", Env: "LD_PRELOAD"}},
		{"two\nlines", HTTPS{Hosts: []string{"a.test"}, Header: "A"}}, // not a header value
		{"", HTTPS{Hosts: []string{"a.test"}, Header: "A"}},           // empty
	} {
		if _, err := s.AddHTTPS("alice", "x", []byte(c.value), c.h); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q %+v: %v, want ErrInvalid", c.value, c.h, err)
		}
	}
	if !s.AnyHTTPS() {
		t.Fatal("AnyHTTPS misses one")
	}
	if again, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key")); err != nil || !again.AnyHTTPS() {
		t.Fatalf("a store opened again misses its https secret: %v", err)
	}
	if _, err := s.Set("alice", "open-ai.key", []byte("a\r\nb")); !errors.Is(err, ErrInvalid) {
		t.Errorf("set to two lines: %v", err)
	}
	if err := s.Remove("alice", "open-ai.key"); err != nil || s.AnyHTTPS() {
		t.Fatalf("after the last https secret went: AnyHTTPS %v, %v", s.AnyHTTPS(), err)
	}
	// The VM's CA is its own, kept, and forgotten with the VM.
	vm := VMRef{Name: "box", Created: time.UnixMilli(5)}
	a, err := s.VMCA(vm)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.VMCA(vm)
	if err != nil || string(a.PEM) != string(b.PEM) {
		t.Fatalf("the ca changed: %v", err)
	}
	if c, err := s.VMCA(VMRef{Name: "box", Created: time.UnixMilli(6)}); err != nil || string(c.PEM) == string(a.PEM) {
		t.Fatalf("a later vm of the same name has the same ca: %v", err)
	}
	if err := s.ForgetVM(vm); err != nil {
		t.Fatal(err)
	}
	if c, err := s.VMCA(vm); err != nil || string(c.PEM) == string(a.PEM) {
		t.Fatalf("the ca outlived its vm: %v", err)
	}
}
