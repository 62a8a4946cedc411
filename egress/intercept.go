package egress

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// interceptTTL is the TTL (seconds) of an intercepted answer: short, so
// that a guest which caches asks again soon after a grant or a revoke.
const interceptTTL = 5

// intercepted is the answer to a query for a name Options.Intercept
// takes for the VM: its A record is the VM's resolver address (its
// gateway, where den's interceptor is reached), other types have none.
func (s *served) intercepted(req *dns.Msg, q dns.Question, name string) *dns.Msg {
	reply := new(dns.Msg).SetReply(req)
	if q.Qtype == dns.TypeA && s.addr.Is4() {
		s.stats.answered(name, []netip.Addr{s.addr})
		reply.Answer = append(reply.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: interceptTTL},
			A:   s.addr.AsSlice(),
		})
	}
	return reply
}

// Resolve is where den itself may connect for vm when it carries one of
// the VM's connections to name (den's HTTPS interceptor): name's IPv4
// addresses as the upstreams answer them, those that vm's current policy
// lets it reach. It fails when the policy does not allow name, when the
// upstreams do not answer, or when no address is left.
func (r *Resolver) Resolve(ctx context.Context, vm, name string) ([]netip.Addr, error) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	r.mu.Lock()
	s := r.vms[vm]
	r.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("resolve %s for vm %s: the vm has no resolver", name, vm)
	}
	p := s.policy.Load()
	if p.Mode == DenyAll || !p.AllowsName(name) {
		return nil, fmt.Errorf("resolve %s for vm %s: the name is not in the vm's egress policy", name, vm)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	resp, err := r.forward(ctx, m, m.Question[0])
	if err != nil {
		return nil, fmt.Errorf("resolve %s for vm %s: %w", name, vm, err)
	}
	addrs, _ := aRecords(resp)
	if !p.Lists(name) {
		// Not admitted by name: each address is the policy's to judge.
		addrs = slices.DeleteFunc(addrs, func(a netip.Addr) bool { return !p.AllowsAddr(a) })
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s for vm %s: no address the vm may reach (%s)", name, vm, dns.RcodeToString[resp.Rcode])
	}
	return addrs, nil
}
