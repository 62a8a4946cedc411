package egress

import (
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ednsSize is the UDP payload size den advertises, to the VMs and to
// the upstreams (DNS flag day 2020).
const ednsSize = 1232

// The TTL Allow is told: the smallest TTL of the A records, within
// these bounds. Answers to an allow list carry TTLs of at most
// maxAllowTTL, so a VM asks again before the firewall forgets.
const (
	minAllowTTL = time.Minute
	maxAllowTTL = time.Hour
)

// serveDNS answers one query of the VM.
func (s *served) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	reply, ede := s.answer(req)
	if reply == nil {
		return // the VM is stopped
	}
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	finish(reply, req, ede, udp)
	if err := w.WriteMsg(reply); err != nil {
		s.r.log.Debug("dns answer not sent", "vm", s.vm, "err", err)
	}
}

// answer is the reply to req (nil: send none), and the Extended DNS
// Error to add to it if the VM speaks EDNS.
func (s *served) answer(req *dns.Msg) (*dns.Msg, *dns.EDNS0_EDE) {
	s.stats.query()
	reply := new(dns.Msg)
	switch {
	case req.Opcode != dns.OpcodeQuery:
		return reply.SetRcode(req, dns.RcodeNotImplemented), nil
	case len(req.Question) == 0:
		return reply.SetRcode(req, dns.RcodeFormatError), nil
	case req.IsEdns0() != nil && req.IsEdns0().Version() != 0:
		return reply.SetRcode(req, dns.RcodeBadVers), nil
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		return reply.SetRcode(req, dns.RcodeRefused), nil
	}
	p := s.policy.Load()
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	switch {
	case p.Mode == DenyAll:
		s.stats.refuse("")
		s.r.log.Debug("dns query refused: deny-all", "vm", s.vm, "name", name)
		return reply.SetRcode(req, dns.RcodeRefused), nil
	case !p.AllowsName(name):
		s.stats.refuse(name)
		s.r.log.Debug("dns query refused: not in the egress policy", "vm", s.vm, "name", name)
		return reply.SetRcode(req, dns.RcodeNameError), &dns.EDNS0_EDE{
			InfoCode:  dns.ExtendedErrorCodeBlocked,
			ExtraText: "den: " + name + " is not in vm's egress policy",
		}
	case s.r.o.Intercept != nil && s.r.o.Intercept(s.vm, name):
		return s.intercepted(req, q, name), nil
	case q.Qtype == dns.TypeAAAA:
		return reply.SetReply(req), nil // VMs have no IPv6 route
	}
	return s.forward(req, q, p), nil
}

// forward is the upstreams' answer to q, nil if the VM was stopped in
// the meantime. When the policy lists the name it tells Allow the
// answer's addresses first.
func (s *served) forward(req *dns.Msg, q dns.Question, p *Policy) *dns.Msg {
	select {
	case s.forwards <- struct{}{}:
		defer func() { <-s.forwards }()
	default:
		s.r.log.Debug("dns query dropped: too many under way", "vm", s.vm, "max", maxForwards)
		return new(dns.Msg).SetRcode(req, dns.RcodeServerFailure)
	}
	resp, err := s.r.forward(s.ctx, req, q)
	if s.ctx.Err() != nil {
		return nil
	}
	if err != nil {
		s.r.warnUpstream(s.vm, q.Name, err)
		return new(dns.Msg).SetRcode(req, dns.RcodeServerFailure)
	}
	addrs, ttl := aRecords(resp)
	s.stats.answered(strings.TrimSuffix(strings.ToLower(q.Name), "."), addrs)
	// The answer's addresses open when the policy lists the name (under
	// a deny list, as exceptions to it).
	if p.Mode == AllowList || p.Mode == DenyList && p.Lists(q.Name) {
		for _, rr := range resp.Answer {
			rr.Header().Ttl = min(rr.Header().Ttl, uint32(maxAllowTTL/time.Second))
		}
		if len(addrs) > 0 && !s.allow(p, addrs, ttl) {
			return nil
		}
	}
	return resp
}

// aRecords are the addresses of the A records of resp's answer (those
// of a CNAME chain's end included) and their smallest TTL, within
// [minAllowTTL, maxAllowTTL].
func aRecords(resp *dns.Msg) ([]netip.Addr, time.Duration) {
	var addrs []netip.Addr
	ttl := maxAllowTTL
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(a.A.To4())
		if !ok {
			continue
		}
		ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
		if !containsAddr(addrs, addr) {
			addrs = append(addrs, addr)
		}
	}
	return addrs, max(ttl, minAllowTTL)
}

func containsAddr(addrs []netip.Addr, a netip.Addr) bool {
	for _, b := range addrs {
		if a == b {
			return true
		}
	}
	return false
}

// finish makes reply an answer to req: its id and question, recursion
// available, an OPT record (with ede) if req had one and none
// otherwise, cut to the size the VM takes over UDP.
func finish(reply, req *dns.Msg, ede *dns.EDNS0_EDE, udp bool) {
	reply.Id = req.Id
	reply.Response = true
	reply.Opcode = req.Opcode
	reply.RecursionDesired = req.RecursionDesired
	reply.RecursionAvailable = true
	reply.Question = req.Question[:min(len(req.Question), 1)]
	extra := reply.Extra[:0]
	for _, rr := range reply.Extra {
		if _, ok := rr.(*dns.OPT); !ok {
			extra = append(extra, rr)
		}
	}
	reply.Extra = extra
	size := dns.MinMsgSize
	if ropt := req.IsEdns0(); ropt != nil {
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetUDPSize(ednsSize)
		opt.SetDo(ropt.Do())
		if ede != nil {
			opt.Option = append(opt.Option, ede)
		}
		reply.Extra = append(reply.Extra, opt)
		size = max(size, int(ropt.UDPSize()))
	}
	if !udp {
		size = dns.MaxMsgSize
	}
	reply.Truncate(size)
}
