package network

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/denhq/den/egress"
)

// nftTimeout bounds one nft command.
const nftTimeout = 15 * time.Second

// table is den's nftables table: one per daemon, created and replaced
// atomically (each change is one nft transaction), never touching the
// host's other tables.
type table struct {
	name string       // "den_<id>", in family inet
	pool netip.Prefix // VMs' addresses
	// intercept, if not 0, is the port on a VM's gateway address that
	// its TCP connections to port 443 of the host's own addresses are
	// redirected to (Config.HTTPS).
	intercept uint16
}

// attachment is what the table holds for one VM.
type attachment struct {
	vm     string
	slot   int
	lease  Lease
	policy egress.Policy
}

// run applies an nft script as one transaction.
func (t table) run(ctx context.Context, script string) error {
	ctx, cancel := context.WithTimeout(ctx, nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if i := strings.IndexByte(msg, '\n'); i > 0 {
			msg = msg[:i]
		}
		return fmt.Errorf("nftables table %s: %w: %s", t.name, err, msg)
	}
	return nil
}

// list runs an nft list command with JSON output.
func (t table) list(ctx context.Context, what ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, nftTimeout)
	defer cancel()
	args := append([]string{"-j", "list"}, what...)
	out, err := exec.CommandContext(ctx, "nft", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("nft list %s: %w", strings.Join(what, " "), err)
	}
	return out, nil
}

// base is the whole table with every VM in atts: the table is made anew
// in one transaction (an old one, of an earlier run of the daemon, goes
// in the same step, so no packet sees a half-made table).
//
// Packets from a TAP go through the VM's chain (vm_N: its own source
// address only, no other VM, then its egress policy) and, addressed to
// the host, through in_N (DNS to its resolver, ping, replies). Packets to
// a TAP pass only as replies. Traffic from the pool leaving by any other
// device is masqueraded.
func (t table) base(atts []attachment) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {}\ndelete table inet %s\n", t.name, t.name)
	fmt.Fprintf(&b, `table inet %s {
	set taps { type ifname; }
	map egress { type ifname : verdict; }
	map ingress { type ifname : verdict; }
	chain forward {
		type filter hook forward priority filter - 1; policy accept;
		iifname @taps jump from_vm
		oifname @taps jump to_vm
	}
	chain from_vm {
		meta nfproto ipv6 drop
		iifname vmap @egress
		drop
	}
	chain to_vm {
		ct state established,related accept
		drop
	}
	chain input {
		type filter hook input priority filter - 1; policy accept;
		iifname @taps jump vm_input
	}
	chain vm_input {
		meta nfproto ipv6 drop
		iifname vmap @ingress
		drop
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %s oifname != @taps masquerade
	}
}
`, t.name, t.pool)
	if t.intercept != 0 {
		// A name den intercepts resolves to the VM's gateway: its HTTPS
		// goes to den's interceptor there.
		fmt.Fprintf(&b, `table inet %s {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname @taps tcp dport 443 fib daddr type local redirect to :%d
	}
}
`, t.name, t.intercept)
	}
	for _, a := range atts {
		b.WriteString(t.vm(a, true))
	}
	return b.String()
}

// names of a VM's objects in the table.
func vmChain(slot int) string    { return fmt.Sprintf("vm_%d", slot) }
func inChain(slot int) string    { return fmt.Sprintf("in_%d", slot) }
func dnsSet(slot int) string     { return fmt.Sprintf("dns_%d", slot) }
func cidrSet(slot int) string    { return fmt.Sprintf("cidr_%d", slot) }
func blockSet(slot int) string   { return fmt.Sprintf("block_%d", slot) }
func logSet(slot int) string     { return fmt.Sprintf("log_%d", slot) }
func deniedName(slot int) string { return fmt.Sprintf("denied_%d", slot) }
func denyChain(slot int) string  { return fmt.Sprintf("deny_%d", slot) }

// vm is the script that (re)makes one VM's objects; with flushDNS the
// addresses its resolver let through are forgotten (a new policy).
func (t table) vm(a attachment, flushDNS bool) string {
	var b strings.Builder
	T, n := t.name, a.slot
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	guest, host := a.lease.GuestIP(), a.lease.HostIP()
	w("add chain inet %s %s", T, vmChain(n))
	w("flush chain inet %s %s", T, vmChain(n))
	w("add chain inet %s %s", T, inChain(n))
	w("flush chain inet %s %s", T, inChain(n))
	w("add chain inet %s %s", T, denyChain(n))
	w("flush chain inet %s %s", T, denyChain(n))
	w("add set inet %s %s { type ipv4_addr; flags timeout; }", T, dnsSet(n))
	if flushDNS {
		w("flush set inet %s %s", T, dnsSet(n))
	}
	w("add set inet %s %s { type ipv4_addr; flags interval; }", T, cidrSet(n))
	w("flush set inet %s %s", T, cidrSet(n))
	if els := elements(a.policy.CIDRs); els != "" {
		w("add element inet %s %s { %s }", T, cidrSet(n), els)
	}
	w("add set inet %s %s { type ipv4_addr; flags interval; }", T, blockSet(n))
	w("flush set inet %s %s", T, blockSet(n))
	if els := elements(a.policy.Deny); els != "" {
		w("add element inet %s %s { %s }", T, blockSet(n), els)
	}
	w("add set inet %s %s { type ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 1h; size 256; counter; }", T, logSet(n))
	w("add counter inet %s %s", T, deniedName(n))
	// Whatever the VM may not send is denied here: counted and remembered
	// (destination, protocol, port) for den net log.
	w("add rule inet %s %s meta l4proto { tcp, udp } update @%s { ip daddr . meta l4proto . th dport }", T, denyChain(n), logSet(n))
	w("add rule inet %s %s meta l4proto icmp update @%s { ip daddr . meta l4proto . 0 }", T, denyChain(n), logSet(n))
	w(`add rule inet %s %s counter name "%s" drop`, T, denyChain(n), deniedName(n))
	// Egress: its own address only; replies and established flows; never
	// another VM; then the policy; what is left is denied.
	w("add rule inet %s %s ip saddr != %s jump %s", T, vmChain(n), guest, denyChain(n))
	w("add rule inet %s %s ct state established,related accept", T, vmChain(n))
	w("add rule inet %s %s ip daddr %s jump %s", T, vmChain(n), t.pool, denyChain(n))
	switch a.policy.Mode {
	case egress.DenyAll:
	case egress.AllowList:
		w("add rule inet %s %s ip daddr @%s accept", T, vmChain(n), cidrSet(n))
		w("add rule inet %s %s ip daddr @%s accept", T, vmChain(n), dnsSet(n))
	case egress.DenyList:
		// What the list allows wins over what it denies.
		w("add rule inet %s %s ip daddr @%s accept", T, vmChain(n), cidrSet(n))
		w("add rule inet %s %s ip daddr @%s accept", T, vmChain(n), dnsSet(n))
		w("add rule inet %s %s ip daddr != @%s accept", T, vmChain(n), blockSet(n))
	default:
		w("add rule inet %s %s accept", T, vmChain(n))
	}
	w("add rule inet %s %s jump %s", T, vmChain(n), denyChain(n))
	// To the host: the VM's resolver, ping and den's interceptor on its
	// own gateway address, and replies to what the host opened; the rest is denied.
	w("add rule inet %s %s ct state established,related accept", T, inChain(n))
	w("add rule inet %s %s ip saddr %s ip daddr %s udp dport 53 accept", T, inChain(n), guest, host)
	w("add rule inet %s %s ip saddr %s ip daddr %s tcp dport 53 accept", T, inChain(n), guest, host)
	w("add rule inet %s %s ip saddr %s ip daddr %s icmp type echo-request accept", T, inChain(n), guest, host)
	if t.intercept != 0 {
		w("add rule inet %s %s ip saddr %s ip daddr %s tcp dport %d ct status dnat socket mark 0x%x accept", T, inChain(n), guest, host, t.intercept, InterceptMark)
	}
	w("add rule inet %s %s jump %s", T, inChain(n), denyChain(n))
	w(`add element inet %s taps { "%s" }`, T, a.lease.Tap)
	w(`add element inet %s egress { "%s" : jump %s }`, T, a.lease.Tap, vmChain(n))
	w(`add element inet %s ingress { "%s" : jump %s }`, T, a.lease.Tap, inChain(n))
	return b.String()
}

// elements are ps as the elements of an interval set ("" for none).
func elements(ps []netip.Prefix) string {
	var els []string
	for _, c := range collapse(ps) {
		els = append(els, c.String())
	}
	return strings.Join(els, ", ")
}

// collapse drops the prefixes another of the list contains: an interval
// set refuses overlapping elements (allow:10.0.0.0/8,10.1.0.0/16).
func collapse(ps []netip.Prefix) []netip.Prefix {
	s := append([]netip.Prefix(nil), ps...)
	sort.Slice(s, func(i, j int) bool { return s[i].Bits() < s[j].Bits() })
	var out []netip.Prefix
	for _, p := range s {
		covered := false
		for _, q := range out {
			if q.Overlaps(p) { // q is no longer than p: it contains p
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	return out
}

// remove is the script that takes a VM's objects out of the table; each
// delete follows an add of the same object, so that a VM whose objects
// are (partly) gone already still removes in one transaction.
func (t table) remove(slot int, tap string) string {
	var b strings.Builder
	T, n := t.name, slot
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("add chain inet %s %s", T, vmChain(n))
	w("add chain inet %s %s", T, inChain(n))
	w(`add element inet %s taps { "%s" }`, T, tap)
	w(`add element inet %s egress { "%s" : jump %s }`, T, tap, vmChain(n))
	w(`add element inet %s ingress { "%s" : jump %s }`, T, tap, inChain(n))
	w(`delete element inet %s taps { "%s" }`, T, tap)
	w(`delete element inet %s egress { "%s" }`, T, tap)
	w(`delete element inet %s ingress { "%s" }`, T, tap)
	w("flush chain inet %s %s", T, vmChain(n))
	w("delete chain inet %s %s", T, vmChain(n))
	w("flush chain inet %s %s", T, inChain(n))
	w("delete chain inet %s %s", T, inChain(n))
	w("add chain inet %s %s", T, denyChain(n))
	w("flush chain inet %s %s", T, denyChain(n))
	w("delete chain inet %s %s", T, denyChain(n))
	w("add set inet %s %s { type ipv4_addr; flags timeout; }", T, dnsSet(n))
	w("delete set inet %s %s", T, dnsSet(n))
	w("add set inet %s %s { type ipv4_addr; flags interval; }", T, cidrSet(n))
	w("delete set inet %s %s", T, cidrSet(n))
	w("add set inet %s %s { type ipv4_addr; flags interval; }", T, blockSet(n))
	w("delete set inet %s %s", T, blockSet(n))
	w("add set inet %s %s { type ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 1h; size 256; counter; }", T, logSet(n))
	w("delete set inet %s %s", T, logSet(n))
	w("add counter inet %s %s", T, deniedName(n))
	w("delete counter inet %s %s", T, deniedName(n))
	return b.String()
}

// allow lets a VM reach addrs for ttl (its resolver answered them); an
// address let through already gets the new timeout.
func (t table) allow(slot int, addrs []netip.Addr, ttl time.Duration) string {
	var els []string
	for _, a := range addrs {
		if a.Is4() {
			els = append(els, a.String())
		}
	}
	if len(els) == 0 {
		return ""
	}
	secs := int(ttl / time.Second)
	if secs < 1 {
		secs = 1
	}
	set := dnsSet(slot)
	var timed []string
	for _, e := range els {
		timed = append(timed, fmt.Sprintf("%s timeout %ds", e, secs))
	}
	list := strings.Join(els, ", ")
	return fmt.Sprintf("add element inet %s %s { %s }\ndelete element inet %s %s { %s }\nadd element inet %s %s { %s }\n",
		t.name, set, list, t.name, set, list, t.name, set, strings.Join(timed, ", "))
}

// Denied is one destination a VM was refused, as its table recorded it.
type Denied struct {
	Addr    string `json:"addr"`
	Proto   string `json:"proto"`
	Port    int    `json:"port,omitempty"`
	Packets uint64 `json:"packets"`
	// Expires is how long the record is kept (it is renewed by every
	// refused packet).
	Expires time.Duration `json:"expires"`
}

// denied reads a VM's denied-packet counter and its log of refused
// destinations.
func (t table) denied(ctx context.Context, slot int) (uint64, []Denied, error) {
	out, err := t.list(ctx, "counter", "inet", t.name, deniedName(slot))
	if err != nil {
		return 0, nil, err
	}
	var ctr struct {
		Nftables []struct {
			Counter *struct {
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &ctr); err != nil {
		return 0, nil, fmt.Errorf("nft counter: %w", err)
	}
	var packets uint64
	for _, o := range ctr.Nftables {
		if o.Counter != nil {
			packets = o.Counter.Packets
		}
	}
	out, err = t.list(ctx, "set", "inet", t.name, logSet(slot))
	if err != nil {
		return packets, nil, err
	}
	var set struct {
		Nftables []struct {
			Set *struct {
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &set); err != nil {
		return packets, nil, fmt.Errorf("nft set: %w", err)
	}
	var log []Denied
	for _, o := range set.Nftables {
		if o.Set == nil {
			continue
		}
		for _, raw := range o.Set.Elem {
			if d, ok := parseDenied(raw); ok {
				log = append(log, d)
			}
		}
	}
	sort.Slice(log, func(i, j int) bool { return log[i].Packets > log[j].Packets })
	return packets, log, nil
}

// parseDenied reads one element of a log set:
// {"elem": {"val": {"concat": [addr, proto, port]}, "expires": s, "counter": {...}}}
func parseDenied(raw json.RawMessage) (Denied, bool) {
	var e struct {
		Elem struct {
			Val struct {
				Concat []any `json:"concat"`
			} `json:"val"`
			Expires int `json:"expires"`
			Counter struct {
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"elem"`
	}
	if json.Unmarshal(raw, &e) != nil || len(e.Elem.Val.Concat) != 3 {
		return Denied{}, false
	}
	d := Denied{Packets: e.Elem.Counter.Packets, Expires: time.Duration(e.Elem.Expires) * time.Second}
	d.Addr, _ = e.Elem.Val.Concat[0].(string)
	switch p := e.Elem.Val.Concat[1].(type) {
	case string:
		d.Proto = p
	case float64:
		d.Proto = fmt.Sprint(int(p))
	}
	switch p := e.Elem.Val.Concat[2].(type) {
	case float64:
		d.Port = int(p)
	case string:
		fmt.Sscan(p, &d.Port)
	}
	return d, d.Addr != ""
}

// dnsAllowed reads, from one listing of the table an earlier run left,
// the addresses each VM's resolver let through (by slot) with what is
// left of their time, to carry them into the remade table. No table, no
// addresses.
func (t table) dnsAllowed(ctx context.Context) map[int]map[netip.Addr]time.Duration {
	out, err := t.list(ctx, "table", "inet", t.name)
	if err != nil {
		return nil
	}
	// Other sets' elements have other shapes (names, concatenations):
	// only the dns sets' are decoded.
	var tab struct {
		Nftables []struct {
			Set *struct {
				Name string            `json:"name"`
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if json.Unmarshal(out, &tab) != nil {
		return nil
	}
	bySlot := map[int]map[netip.Addr]time.Duration{}
	for _, o := range tab.Nftables {
		var slot int
		if o.Set == nil || len(o.Set.Elem) == 0 {
			continue
		}
		if _, err := fmt.Sscanf(o.Set.Name, "dns_%d", &slot); err != nil || dnsSet(slot) != o.Set.Name {
			continue
		}
		m := map[netip.Addr]time.Duration{}
		for _, raw := range o.Set.Elem {
			var e struct {
				Elem struct {
					Val     string `json:"val"`
					Expires int    `json:"expires"`
				} `json:"elem"`
			}
			if json.Unmarshal(raw, &e) != nil {
				continue
			}
			if a, err := netip.ParseAddr(e.Elem.Val); err == nil && e.Elem.Expires > 0 {
				m[a] = time.Duration(e.Elem.Expires) * time.Second
			}
		}
		bySlot[slot] = m
	}
	return bySlot
}
