package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/denhq/den/internal/netns"
)

// testNet is a pair of network namespaces a test makes (netns.Pair):
// the daemon under test runs in den, the test's servers in wan. No test
// traffic leaves them.
type testNet struct {
	t        testing.TB
	den, wan string
}

// Addresses of the test network.
const (
	denUplink = netns.DenUplink
	wanAddr   = netns.WANAddr
	wanHostA  = netns.WANHostA // allowed.test
	wanHostB  = netns.WANHostB // other.test
)

// newTestNet makes the namespaces (removed when the test ends).
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft (make deps installs nftables)")
	}
	p, err := netns.NewPair(fmt.Sprintf("e2e%d", os.Getpid()%100000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &testNet{t: t, den: p.Den, wan: p.WAN}
}

// listen listens on addr inside namespace ns.
func (n *testNet) listen(ns, network, addr string) net.Listener {
	n.t.Helper()
	ln, err := netns.Listen(ns, network, addr)
	if err != nil {
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
	pc, err := netns.ListenPacket(ns, "udp", addr+":53")
	if err != nil {
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
	return &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: netns.Dialer(ns)}}
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
