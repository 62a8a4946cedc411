package egress

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestIntercept: a name Intercept takes is answered with the VM's
// resolver address and a short TTL, not asked upstream, and never when
// the policy does not allow it; other names go on as before.
func TestIntercept(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	h.r.o.Intercept = func(vm, name string) bool { return vm == "box" && name == "plain.test" }
	addr := h.serve(t, "box", mustParse(t, "allow:plain.test,short.test"))
	other := h.serve(t, "other", Policy{Mode: AllowAll})

	r := query(t, addr, "Plain.Test.", dns.TypeA, "udp", true)
	if rcode(r) != "NOERROR" || !reflect.DeepEqual(addrs(r), []netip.Addr{addr.Addr()}) || r.Answer[0].Header().Ttl != interceptTTL {
		t.Fatalf("intercepted A: %s %v", rcode(r), r.Answer)
	}
	if n := h.r.NameOf("box", addr.Addr()); n != "plain.test" {
		t.Fatalf("NameOf the vm's own address: %q", n)
	}
	if r := query(t, addr, "plain.test.", dns.TypeAAAA, "udp", true); rcode(r) != "NOERROR" || len(r.Answer) != 0 {
		t.Fatalf("intercepted AAAA: %s %v", rcode(r), r.Answer)
	}
	for _, q := range up.questions() {
		if strings.HasPrefix(q, "plain.test. ") {
			t.Fatalf("the intercepted name went upstream: %v", up.questions())
		}
	}
	if r := query(t, addr, "short.test.", dns.TypeA, "tcp", false); !reflect.DeepEqual(addrs(r), parseAddrs("192.0.2.5")) {
		t.Fatalf("a name not intercepted: %v", r.Answer)
	}
	if r := query(t, other, "plain.test.", dns.TypeA, "udp", false); !reflect.DeepEqual(addrs(r), parseAddrs("192.0.2.1")) {
		t.Fatalf("another vm's answer: %v", r.Answer)
	}
	h.r.SetPolicy("box", Policy{Mode: DenyAll})
	if r := query(t, addr, "plain.test.", dns.TypeA, "udp", false); rcode(r) != "REFUSED" {
		t.Fatalf("deny-all still intercepts: %s %v", rcode(r), r.Answer)
	}
}

// TestResolve: what den may dial for a VM is what its policy lets it
// reach, asked of the upstreams.
func TestResolve(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, time.Second, up.addr)
	h.serve(t, "box", mustParse(t, "deny:192.0.2.0/24;allow:plain.test"))
	h.serve(t, "list", mustParse(t, "allow:example.org"))
	ctx := context.Background()
	for _, c := range []struct {
		vm, name string
		want     []netip.Addr
		err      string
	}{
		{"box", "plain.test", parseAddrs("192.0.2.1"), ""}, // listed: its addresses
		{"box", "www.example.org.", parseAddrs("198.51.100.1", "198.51.100.2"), ""},
		{"box", "short.test", nil, "no address the vm may reach"},   // 192.0.2.5 is denied
		{"box", "missing.test", nil, "no address the vm may reach"}, // NXDOMAIN
		{"list", "example.org", parseAddrs("192.0.2.9"), ""},
		{"list", "plain.test", nil, "not in the vm's egress policy"},
		{"nobody", "plain.test", nil, "has no resolver"},
	} {
		got, err := h.r.Resolve(ctx, c.vm, c.name)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s %s: %v %v, want an error with %q", c.vm, c.name, got, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s %s: %v %v, want %v", c.vm, c.name, got, err, c.want)
		}
	}
}
