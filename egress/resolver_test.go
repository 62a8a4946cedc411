package egress

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The upstream's zone: names and their A records. big.test is
// truncated over UDP; www.example.org is a CNAME chain.
var zone = map[string][]string{
	"plain.test.":      {"plain.test. 300 IN A 192.0.2.1"},
	"short.test.":      {"short.test. 5 IN A 192.0.2.5"},
	"example.org.":     {"example.org. 300 IN A 192.0.2.9"},
	"a.b.example.org.": {"a.b.example.org. 300 IN A 192.0.2.10"},
	"denied.test.":     {"denied.test. 300 IN A 192.0.2.66"},
	"www.example.org.": {
		"www.example.org. 7200 IN CNAME edge.cdn.test.",
		"edge.cdn.test. 7200 IN CNAME edge2.cdn.test.",
		"edge2.cdn.test. 7200 IN A 198.51.100.1",
		"edge2.cdn.test. 9000 IN A 198.51.100.2",
	},
}

// bigAnswer is how many A records big.test has.
const bigAnswer = 40

func init() {
	for i := 1; i <= bigAnswer; i++ {
		zone["big.test."] = append(zone["big.test."], fmt.Sprintf("big.test. 600 IN A 203.0.113.%d", i))
	}
}

// upstream is a DNS server on 127.0.0.1 (UDP and TCP, one port) that
// answers zone and records the questions it gets.
type upstream struct {
	addr string
	mu   sync.Mutex
	seen []string // "name type net"
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	pc, ln := listenPair(t)
	u := &upstream{addr: pc.LocalAddr().String()}
	for _, srv := range []*dns.Server{{PacketConn: pc}, {Listener: ln}} {
		srv.Handler = dns.HandlerFunc(u.serve)
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.ActivateAndServe()
		}()
		<-started
		t.Cleanup(func() {
			srv.Shutdown()
			<-done
		})
	}
	return u
}

func (u *upstream) serve(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	network := map[bool]string{false: "udp", true: "tcp"}[tcp]
	u.mu.Lock()
	u.seen = append(u.seen, fmt.Sprintf("%s %s %s", strings.ToLower(q.Name), dns.TypeToString[q.Qtype], network))
	u.mu.Unlock()
	m := new(dns.Msg).SetReply(req)
	rrs, ok := zone[strings.ToLower(q.Name)]
	switch {
	case !ok:
		m.Rcode = dns.RcodeNameError
	case q.Qtype != dns.TypeA:
	case strings.EqualFold(q.Name, "big.test.") && !tcp:
		m.Truncated = true
	default:
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				panic(err)
			}
			m.Answer = append(m.Answer, rr)
		}
	}
	w.WriteMsg(m)
}

func (u *upstream) questions() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// listenPair binds UDP and TCP on one free port of 127.0.0.1.
func listenPair(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp4", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal("no port free for both UDP and TCP on 127.0.0.1")
	return nil, nil
}

// allowCall is one call of Options.Allow.
type allowCall struct {
	vm    string
	addrs []netip.Addr
	ttl   time.Duration
}

// harness is a resolver and what it told Allow.
type harness struct {
	r     *Resolver
	mu    sync.Mutex
	calls []allowCall
	// hook, if set, runs in Allow.
	hook func()
}

func newHarness(t *testing.T, timeout time.Duration, upstreams ...string) *harness {
	t.Helper()
	h := &harness{}
	h.r = NewResolver(Options{
		Upstreams: upstreams,
		Allow: func(vm string, _ Policy, addrs []netip.Addr, ttl time.Duration) {
			h.mu.Lock()
			h.calls = append(h.calls, allowCall{vm, addrs, ttl})
			hook := h.hook
			h.mu.Unlock()
			if hook != nil {
				hook()
			}
		},
		Logger:  slog.New(slog.DiscardHandler),
		Timeout: timeout,
	})
	t.Cleanup(h.r.Close)
	return h
}

func (h *harness) allowed() []allowCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]allowCall(nil), h.calls...)
}

// serve serves vm on a free port of 127.0.0.1.
func (h *harness) serve(t *testing.T, vm string, p Policy) netip.AddrPort {
	t.Helper()
	var err error
	for range 20 {
		pc, ln := listenPair(t)
		addr := netip.MustParseAddrPort(pc.LocalAddr().String())
		pc.Close()
		ln.Close()
		if err = h.r.Serve(vm, addr, p); err == nil {
			return addr
		}
	}
	t.Fatalf("serve %s: %v", vm, err)
	return netip.AddrPort{}
}

// query asks addr name/qtype over network (udp or tcp), with EDNS if
// edns; it checks the reply keeps the id and question and offers
// recursion.
func query(t *testing.T, addr netip.AddrPort, name string, qtype uint16, network string, edns bool) *dns.Msg {
	t.Helper()
	r, err := exchange(addr, name, qtype, network, edns)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

func exchange(addr netip.AddrPort, name string, qtype uint16, network string, edns bool) (*dns.Msg, error) {
	m := new(dns.Msg).SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(4096, false)
	}
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, addr.String())
	if err != nil {
		return nil, err
	}
	switch {
	case r.Id != m.Id:
		return r, fmt.Errorf("id %d, asked %d", r.Id, m.Id)
	case !reflect.DeepEqual(r.Question, m.Question):
		return r, fmt.Errorf("question %v, asked %v", r.Question, m.Question)
	case !r.RecursionAvailable:
		return r, fmt.Errorf("recursion not available")
	case (r.IsEdns0() != nil) != edns:
		return r, fmt.Errorf("OPT in the reply: %v, in the query: %v", r.IsEdns0() != nil, edns)
	}
	return r, nil
}

// addrs are the A records of r's answer.
func addrs(r *dns.Msg) []netip.Addr {
	var as []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			as = append(as, netip.MustParseAddr(a.A.String()))
		}
	}
	return as
}

func parseAddrs(ss ...string) []netip.Addr {
	var as []netip.Addr
	for _, s := range ss {
		as = append(as, netip.MustParseAddr(s))
	}
	return as
}

func mustParse(t *testing.T, s string) Policy {
	t.Helper()
	p, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rcode(r *dns.Msg) string { return dns.RcodeToString[r.Rcode] }

func TestAllowAll(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", Policy{})
	for _, network := range []string{"udp", "tcp"} {
		r := query(t, addr, "plain.test.", dns.TypeA, network, true)
		if rcode(r) != "NOERROR" || !reflect.DeepEqual(addrs(r), parseAddrs("192.0.2.1")) {
			t.Errorf("plain.test over %s: %s %v", network, rcode(r), r.Answer)
		}
		r = query(t, addr, "WWW.Example.Org.", dns.TypeA, network, false)
		if rcode(r) != "NOERROR" || len(r.Answer) != 4 || r.Answer[0].Header().Ttl != 7200 {
			t.Errorf("www.example.org over %s: %s %v", network, rcode(r), r.Answer)
		}
		r = query(t, addr, "nosuch.test.", dns.TypeA, network, true)
		if rcode(r) != "NXDOMAIN" || len(r.IsEdns0().Option) != 0 {
			t.Errorf("nosuch.test over %s: %s %v", network, rcode(r), r.Extra)
		}
	}
	if calls := h.allowed(); len(calls) != 0 {
		t.Errorf("allow-all called Allow: %v", calls)
	}
	// The names answered are remembered for the activity record.
	if n := h.r.NameOf("box", netip.MustParseAddr("192.0.2.1")); n != "plain.test" {
		t.Errorf("NameOf 192.0.2.1: %q, want plain.test", n)
	}
	if n := h.r.NameOf("box", netip.MustParseAddr("192.0.2.99")); n != "" {
		t.Errorf("NameOf an address never answered: %q", n)
	}
	if n := h.r.NameOf("other", netip.MustParseAddr("192.0.2.1")); n != "" {
		t.Errorf("NameOf for another VM: %q", n)
	}
}

func TestDenyAll(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", Policy{Mode: DenyAll})
	for _, network := range []string{"udp", "tcp"} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT} {
			if r := query(t, addr, "plain.test.", qtype, network, true); rcode(r) != "REFUSED" || len(r.Answer) != 0 {
				t.Errorf("deny-all %s over %s: %s %v", dns.TypeToString[qtype], network, rcode(r), r.Answer)
			}
		}
	}
	if q := up.questions(); len(q) != 0 {
		t.Errorf("deny-all asked the upstream %v", q)
	}
	if st := h.r.Stats("box"); st.Queries != 6 || st.Refused != 6 || len(st.LastRefused) != 0 {
		t.Errorf("Stats = %+v", st)
	}
	if calls := h.allowed(); len(calls) != 0 {
		t.Errorf("deny-all called Allow: %v", calls)
	}
}

func TestAllowList(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test,short.test,big.test,*.example.org,10.0.0.0/8"))
	for _, c := range []struct {
		name  string
		addrs []netip.Addr
		ttl   time.Duration
	}{
		{"plain.test.", parseAddrs("192.0.2.1"), 300 * time.Second},
		{"PLAIN.Test.", parseAddrs("192.0.2.1"), 300 * time.Second},
		{"short.test.", parseAddrs("192.0.2.5"), time.Minute},
		{"www.example.org.", parseAddrs("198.51.100.1", "198.51.100.2"), time.Hour},
		{"a.b.example.org.", parseAddrs("192.0.2.10"), 300 * time.Second},
	} {
		before := len(h.allowed())
		r := query(t, addr, c.name, dns.TypeA, "udp", true)
		// Allow was called before the answer was sent.
		calls := h.allowed()
		if len(calls) != before+1 {
			t.Errorf("%s: Allow was called %d times before the answer, want once", c.name, len(calls)-before)
			continue
		}
		want := allowCall{"box", c.addrs, c.ttl}
		if got := calls[before]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Allow%v, want Allow%v", c.name, got, want)
		}
		if rcode(r) != "NOERROR" || !reflect.DeepEqual(addrs(r), c.addrs) {
			t.Errorf("%s: %s %v", c.name, rcode(r), r.Answer)
		}
		for _, rr := range r.Answer {
			if rr.Header().Ttl > 3600 {
				t.Errorf("%s: TTL %d above an hour: %v", c.name, rr.Header().Ttl, rr)
			}
		}
	}

	// A name the policy does not list: NXDOMAIN with an Extended DNS
	// Error, and the upstream is not asked.
	for _, name := range []string{"example.org.", "denied.test.", "plain.test.evil.", "xexample.org."} {
		r := query(t, addr, name, dns.TypeA, "udp", true)
		text := "den: " + strings.TrimSuffix(name, ".") + " is not in vm's egress policy"
		if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 || !hasEDE(r, dns.ExtendedErrorCodeBlocked, text) {
			t.Errorf("%s: %s %v, want NXDOMAIN with EDE %q", name, rcode(r), r.Extra, text)
		}
	}
	if r := query(t, addr, "denied.test.", dns.TypeA, "tcp", false); rcode(r) != "NXDOMAIN" {
		t.Errorf("denied.test without EDNS: %s", rcode(r))
	}
	for _, q := range up.questions() {
		if strings.HasPrefix(q, "denied.test") || strings.HasPrefix(q, "example.org") {
			t.Errorf("the upstream was asked %s", q)
		}
	}
	if calls := h.allowed(); len(calls) != 5 {
		t.Errorf("Allow calls %v, want 5", calls)
	}
}

// TestDenyList: under a deny list every name resolves; only the names
// its exceptions list open their addresses (Allow), before the answer.
func TestDenyList(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", mustParse(t, "deny:192.0.2.0/24;allow:plain.test,*.example.org"))
	for _, c := range []struct {
		name   string
		addrs  []netip.Addr
		listed bool
	}{
		{"plain.test.", parseAddrs("192.0.2.1"), true},
		{"short.test.", parseAddrs("192.0.2.5"), false},
		{"www.example.org.", parseAddrs("198.51.100.1", "198.51.100.2"), true},
	} {
		before := len(h.allowed())
		r := query(t, addr, c.name, dns.TypeA, "udp", true)
		if rcode(r) != "NOERROR" || !reflect.DeepEqual(addrs(r), c.addrs) {
			t.Errorf("%s: %s %v", c.name, rcode(r), r.Answer)
		}
		calls := h.allowed()[before:]
		if c.listed && (len(calls) != 1 || !reflect.DeepEqual(calls[0].addrs, c.addrs)) || !c.listed && len(calls) != 0 {
			t.Errorf("%s (listed %v): Allow calls %v", c.name, c.listed, calls)
		}
	}
	if st := h.r.Stats("box"); st.Refused != 0 {
		t.Errorf("a deny list refused names: %+v", st)
	}
}

// Allow runs before the answer is sent: while Allow runs, the VM's
// socket has no answer waiting (on loopback a datagram sent is queued
// at once).
func TestAllowBeforeAnswer(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test"))
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan bool, 1)
	h.hook = func() {
		var n int
		raw.Control(func(fd uintptr) { // not Read: conn.Read holds the read lock
			n, _, _ = unix.Recvfrom(int(fd), make([]byte, 1), unix.MSG_PEEK|unix.MSG_DONTWAIT)
		})
		waiting <- n > 0
	}
	m := new(dns.Msg).SetQuestion("plain.test.", dns.TypeA)
	b, _ := m.Pack()
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil || r.Id != m.Id || rcode(r) != "NOERROR" {
		t.Fatalf("answer %v, %v", r, err)
	}
	select {
	case answered := <-waiting:
		if answered {
			t.Error("the answer was sent before Allow was called")
		}
	default:
		t.Error("Allow was not called before the answer")
	}
}

// hasEDE says whether r's OPT holds the Extended DNS Error code, text.
func hasEDE(r *dns.Msg, code uint16, text string) bool {
	opt := r.IsEdns0()
	if opt == nil {
		return false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok && e.InfoCode == code && e.ExtraText == text {
			return true
		}
	}
	return false
}

func TestTruncated(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", mustParse(t, "allow:big.test"))
	var want []netip.Addr
	for i := 1; i <= bigAnswer; i++ {
		want = append(want, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}))
	}

	// The upstream truncates over UDP: the resolver asks again over TCP.
	r := query(t, addr, "big.test.", dns.TypeA, "udp", true)
	if rcode(r) != "NOERROR" || r.Truncated || !reflect.DeepEqual(addrs(r), want) {
		t.Errorf("big.test: %s truncated=%v, %d records", rcode(r), r.Truncated, len(r.Answer))
	}
	if q := up.questions(); !reflect.DeepEqual(q, []string{"big.test. A udp", "big.test. A tcp"}) {
		t.Errorf("the upstream was asked %v", q)
	}
	calls := h.allowed()
	if len(calls) != 1 || !reflect.DeepEqual(calls[0].addrs, want) || calls[0].ttl != 600*time.Second {
		t.Errorf("Allow calls %v", calls)
	}

	// A VM without EDNS takes 512 bytes over UDP: truncated, then TCP.
	r = query(t, addr, "big.test.", dns.TypeA, "udp", false)
	if !r.Truncated || len(r.Answer) >= bigAnswer {
		t.Errorf("big.test to a client without EDNS: truncated=%v, %d records", r.Truncated, len(r.Answer))
	}
	r = query(t, addr, "big.test.", dns.TypeA, "tcp", false)
	if r.Truncated || !reflect.DeepEqual(addrs(r), want) {
		t.Errorf("big.test over TCP: truncated=%v, %d records", r.Truncated, len(r.Answer))
	}
}

func TestAAAA(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	for vm, p := range map[string]Policy{"all": {}, "list": mustParse(t, "allow:plain.test")} {
		addr := h.serve(t, vm, p)
		for _, network := range []string{"udp", "tcp"} {
			r := query(t, addr, "plain.test.", dns.TypeAAAA, network, true)
			if rcode(r) != "NOERROR" || len(r.Answer) != 0 || len(r.Ns) != 0 {
				t.Errorf("%s: AAAA over %s: %s %v", vm, network, rcode(r), r)
			}
		}
	}
	if q := up.questions(); len(q) != 0 {
		t.Errorf("the upstream was asked %v", q)
	}
	if calls := h.allowed(); len(calls) != 0 {
		t.Errorf("Allow calls %v", calls)
	}
}

func TestNotInternet(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", Policy{})
	m := new(dns.Msg).SetQuestion("version.bind.", dns.TypeTXT)
	m.Question[0].Qclass = dns.ClassCHAOS
	r, err := dns.Exchange(m, addr.String())
	if err != nil || r.Rcode != dns.RcodeRefused || r.Id != m.Id {
		t.Errorf("CHAOS query: %v %v", r, err)
	}
	m = new(dns.Msg).SetNotify("plain.test.")
	r, err = dns.Exchange(m, addr.String())
	if err != nil || r.Rcode != dns.RcodeNotImplemented {
		t.Errorf("NOTIFY: %v %v", r, err)
	}
	if q := up.questions(); len(q) != 0 {
		t.Errorf("the upstream was asked %v", q)
	}
}

// silent is a UDP socket on 127.0.0.1 that reads queries and never
// answers; got receives a value per query.
func silent(t *testing.T) (addr string, got <-chan struct{}) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := make(chan struct{}, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			c <- struct{}{}
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	return pc.LocalAddr().String(), c
}

// closedPort is a UDP address of 127.0.0.1 nothing listens on.
func closedPort(t *testing.T) string {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc.Close()
	return pc.LocalAddr().String()
}

func TestDeadUpstream(t *testing.T) {
	up := startUpstream(t)
	dead, _ := silent(t)
	const timeout = 300 * time.Millisecond
	h := newHarness(t, timeout, dead)
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test"))
	start := time.Now()
	r := query(t, addr, "plain.test.", dns.TypeA, "udp", true)
	if took := time.Since(start); rcode(r) != "SERVFAIL" || took < timeout || took > timeout+time.Second {
		t.Errorf("dead upstream: %s after %v, want SERVFAIL after %v", rcode(r), took, timeout)
	}
	if calls := h.allowed(); len(calls) != 0 {
		t.Errorf("Allow calls %v", calls)
	}

	// The next upstream answers when one times out or refuses.
	for _, first := range []string{dead, closedPort(t)} {
		h := newHarness(t, timeout, first, up.addr)
		addr := h.serve(t, "box", Policy{})
		r := query(t, addr, "plain.test.", dns.TypeA, "udp", true)
		if rcode(r) != "NOERROR" || !reflect.DeepEqual(addrs(r), parseAddrs("192.0.2.1")) {
			t.Errorf("upstreams %s, %s: %s %v", first, up.addr, rcode(r), r.Answer)
		}
	}
}

func TestSetPolicy(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", Policy{})
	h.serve(t, "other", Policy{Mode: DenyAll})
	check := func(name, want string) {
		t.Helper()
		if r := query(t, addr, name, dns.TypeA, "udp", true); rcode(r) != want {
			t.Errorf("%s: %s, want %s", name, rcode(r), want)
		}
	}
	check("plain.test.", "NOERROR")
	check("short.test.", "NOERROR")
	h.r.SetPolicy("box", Policy{Mode: DenyAll})
	check("plain.test.", "REFUSED")
	h.r.SetPolicy("box", mustParse(t, "allow:plain.test"))
	check("plain.test.", "NOERROR")
	check("short.test.", "NXDOMAIN")
	h.r.SetPolicy("box", Policy{Mode: AllowAll})
	check("short.test.", "NOERROR")
	h.r.SetPolicy("nosuch", Policy{Mode: DenyAll}) // not served: nothing happens
	if calls := h.allowed(); len(calls) != 1 || calls[0].vm != "box" {
		t.Errorf("Allow calls %v, want one for plain.test", calls)
	}
}

func TestStats(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test"))
	query(t, addr, "plain.test.", dns.TypeA, "udp", true)
	var want []string
	for i := range 20 {
		name := fmt.Sprintf("n%d.test", i)
		query(t, addr, name+".", dns.TypeA, "udp", true)
		want = append(want, name)
	}
	// Refused again: it moves to the end, once.
	query(t, addr, "N10.Test.", dns.TypeA, "tcp", true)
	want = append(want[:10], want[11:]...)
	want = append(want, "n10.test")
	st := h.r.Stats("box")
	if st.Queries != 22 || st.Refused != 21 || !reflect.DeepEqual(st.LastRefused, want[len(want)-16:]) {
		t.Errorf("Stats = %+v, want 22 queries, 21 refused, last %v", st, want[len(want)-16:])
	}
	st.LastRefused[0] = "changed"
	if h.r.Stats("box").LastRefused[0] == "changed" {
		t.Error("Stats shares its slice")
	}
	if st := h.r.Stats("nosuch"); !reflect.DeepEqual(st, Stats{}) {
		t.Errorf("Stats of a vm not served: %+v", st)
	}
}

func TestServeStopServe(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	base := runtime.NumGoroutine()
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test"))
	for i := range 3 {
		for _, network := range []string{"udp", "tcp"} {
			if r := query(t, addr, "plain.test.", dns.TypeA, network, true); rcode(r) != "NOERROR" {
				t.Fatalf("round %d over %s: %s", i, network, rcode(r))
			}
		}
		h.r.Stop("box")
		if _, err := exchange(addr, "plain.test.", dns.TypeA, "tcp", true); err == nil {
			t.Fatalf("round %d: the vm still answers over TCP after Stop", i)
		}
		if st := h.r.Stats("box"); st.Queries != 0 {
			t.Errorf("Stats after Stop: %+v", st)
		}
		h.r.Stop("box") // twice: nothing happens
		if err := h.r.Serve("box", addr, mustParse(t, "allow:plain.test")); err != nil {
			t.Fatalf("round %d: Serve on the same address after Stop: %v", i, err)
		}
	}

	// Serving again without Stop replaces the listeners on the same
	// address and keeps the stats.
	query(t, addr, "denied.test.", dns.TypeA, "udp", true)
	if err := h.r.Serve("box", addr, Policy{Mode: DenyAll}); err != nil {
		t.Fatalf("Serve again: %v", err)
	}
	for _, network := range []string{"udp", "tcp"} {
		if r := query(t, addr, "plain.test.", dns.TypeA, network, true); rcode(r) != "REFUSED" {
			t.Errorf("after Serve with deny-all, over %s: %s", network, rcode(r))
		}
	}
	if st := h.r.Stats("box"); st.Queries != 3 || st.Refused != 3 || len(st.LastRefused) != 1 {
		t.Errorf("Stats after Serve again: %+v", st)
	}

	// Two VMs cannot share an address.
	if err := h.r.Serve("other", addr, Policy{}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Serve on a taken address: %v", err)
	}
	if err := h.r.Serve("other", netip.MustParseAddrPort("127.0.0.1:0"), Policy{}); err == nil {
		t.Error("Serve on port 0 succeeded")
	}

	h.r.Close()
	testutil.WaitFor(t, "the resolver's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
	if _, err := exchange(addr, "plain.test.", dns.TypeA, "tcp", true); err == nil {
		t.Error("the vm answers after Close")
	}
	if err := h.r.Serve("box", addr, Policy{}); err == nil {
		t.Error("Serve after Close succeeded")
	}
	h.r.Close() // twice: nothing happens
}

// A query at the upstreams when the VM stops ends at once, without an
// answer or an Allow call.
func TestStopCutsQueries(t *testing.T) {
	dead, got := silent(t)
	h := newHarness(t, time.Minute, dead)
	base := runtime.NumGoroutine()
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test"))
	errc := make(chan error, 1)
	go func() {
		_, err := exchange(addr, "plain.test.", dns.TypeA, "tcp", true)
		errc <- err
	}()
	<-got // the query is at the upstream
	start := time.Now()
	h.r.Stop("box")
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Stop took %v", took)
	}
	if err := <-errc; err == nil {
		t.Error("the query got an answer")
	}
	testutil.WaitFor(t, "the resolver's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
	if calls := h.allowed(); len(calls) != 0 {
		t.Errorf("Allow calls %v", calls)
	}
}

func TestUpstreams(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "resolv.conf")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("# generated\nsearch example.org\nnameserver 192.0.2.53\n  nameserver\t2001:db8::53 \nnameserver fe80::1%eth0\n" +
		"nameserver bogus\nnameserver\nnameserver 192.0.2.53\noptions edns0\n")
	ups, err := Upstreams(path)
	want := []string{"192.0.2.53:53", "[2001:db8::53]:53", "[fe80::1%eth0]:53"}
	if err != nil || !reflect.DeepEqual(ups, want) {
		t.Errorf("Upstreams = %v, %v; want %v", ups, err, want)
	}
	write("search example.org\n")
	if _, err := Upstreams(path); err == nil || err.Error() != "dns upstreams: no nameserver in "+path {
		t.Errorf("Upstreams of a file without nameservers: %v", err)
	}
	if _, err := Upstreams(filepath.Join(dir, "nosuch")); err == nil {
		t.Error("Upstreams of a missing file: no error")
	}

	// The resolver reads the file again when it changes.
	c := &resolvConf{path: path}
	if _, err := c.get(); err == nil {
		t.Error("no nameservers: no error")
	}
	write("nameserver 192.0.2.1\nnameserver 192.0.2.2\n")
	if ups, err := c.get(); err != nil || !reflect.DeepEqual(ups, []string{"192.0.2.1:53", "192.0.2.2:53"}) {
		t.Errorf("after a change: %v, %v", ups, err)
	}
}
