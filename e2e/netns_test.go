package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// testNet is a pair of network namespaces a test makes: "den", where the
// daemon under test runs (its TAPs, VM subnet, nftables table and NAT
// live there), and "wan", the outside world joined to it by a veth pair,
// where the test's servers run. No test traffic leaves them.
//
//	den: vd 10.99.0.1/24, default route via 10.99.0.2
//	wan: vw 10.99.0.2/24; lo 10.99.1.1, 10.99.1.2 (two "internet" hosts)
type testNet struct {
	t        testing.TB
	den, wan string
}

// Addresses of the test network.
const (
	denUplink = "10.99.0.1" // the den namespace's side of the veth
	wanAddr   = "10.99.0.2" // the wan side: HTTP and DNS servers
	wanHostA  = "10.99.1.1" // allowed.test
	wanHostB  = "10.99.1.2" // other.test
)

// newTestNet makes the namespaces (removed when the test ends).
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft (make deps installs nftables)")
	}
	id := fmt.Sprintf("%d", os.Getpid()%100000)
	n := &testNet{t: t, den: "dene2e" + id, wan: "wane2e" + id}
	n.cleanup()
	t.Cleanup(n.cleanup)
	for _, args := range [][]string{
		{"netns", "add", n.den},
		{"netns", "add", n.wan},
		{"link", "add", "vd", "netns", n.den, "type", "veth", "peer", "name", "vw", "netns", n.wan},
		{"-n", n.den, "addr", "add", denUplink + "/24", "dev", "vd"},
		{"-n", n.den, "link", "set", "vd", "up"},
		{"-n", n.den, "link", "set", "lo", "up"},
		{"-n", n.den, "route", "add", "default", "via", wanAddr},
		{"-n", n.wan, "addr", "add", wanAddr + "/24", "dev", "vw"},
		{"-n", n.wan, "link", "set", "vw", "up"},
		{"-n", n.wan, "link", "set", "lo", "up"},
		{"-n", n.wan, "addr", "add", wanHostA + "/32", "dev", "lo"},
		{"-n", n.wan, "addr", "add", wanHostB + "/32", "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return n
}

func (n *testNet) cleanup() {
	for _, ns := range []string{n.den, n.wan} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// in runs fn on a thread inside namespace ns; sockets fn makes stay in
// ns. The thread is never returned to the runtime (it ends with the
// goroutine), so no other goroutine runs in ns by accident.
func (n *testNet) in(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// listen listens on addr inside namespace ns.
func (n *testNet) listen(ns, network, addr string) net.Listener {
	n.t.Helper()
	var ln net.Listener
	if err := n.in(ns, func() (err error) { ln, err = net.Listen(network, addr); return }); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { ln.Close() })
	return ln
}

// serveHTTP serves h on addr in namespace ns.
func (n *testNet) serveHTTP(ns, addr string, h http.Handler) {
	ln := n.listen(ns, "tcp", addr)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	n.t.Cleanup(func() { srv.Close() })
}

// serveDNS answers A queries for names from the zone (others NXDOMAIN)
// on addr:53 (UDP) in namespace ns.
func (n *testNet) serveDNS(ns, addr string, zone map[string]string) {
	n.t.Helper()
	var pc net.PacketConn
	if err := n.in(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr+":53"); return }); err != nil {
		n.t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		ip, ok := zone[name]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(ip)})
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	n.t.Cleanup(func() { _ = srv.Shutdown() })
}

// client is an HTTP client whose connections are made in namespace ns.
func (n *testNet) client(ns string) *http.Client {
	return &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := n.in(ns, func() (err error) {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
				return
			})
			return c, err
		},
	}}
}

// ip runs the ip command in namespace ns.
func (n *testNet) ip(ns string, args ...string) string {
	n.t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// nft lists the ruleset of namespace ns.
func (n *testNet) nft(ns string) string {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		n.t.Fatalf("nft list ruleset in %s: %v: %s", ns, err, out)
	}
	return string(out)
}
