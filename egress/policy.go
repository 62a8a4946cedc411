// Package egress decides what a VM may reach: its egress policy, and a DNS resolver that answers only the names the policy allows and opens the firewall for their answers.
package egress

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/denhq/den/internal/validate"
)

// ErrInvalid is wrapped by every error Parse returns; it is
// validate.ErrInvalid, which the API maps to 400.
var ErrInvalid = validate.ErrInvalid

// Mode is what a policy does with traffic it does not list.
type Mode string

// The modes of a policy.
const (
	// AllowAll lets the VM reach anything (the zero Policy's mode).
	AllowAll Mode = "allow-all"
	// DenyAll lets the VM reach nothing; its resolver refuses every query.
	DenyAll Mode = "deny-all"
	// AllowList lets the VM reach the listed CIDRs and the addresses the
	// listed domains resolve to.
	AllowList Mode = "allow"
	// DenyList lets the VM reach anything but the Deny CIDRs, except
	// that the listed CIDRs and the addresses the listed domains resolve
	// to are reached even there (an allow entry wins over a deny entry).
	DenyList Mode = "deny"
)

// Limits of a policy as written.
const (
	// MaxEntries is the most entries a list may have (after duplicates
	// are merged).
	MaxEntries = 256
	// MaxLen is the longest policy string Parse reads, in bytes.
	MaxLen = 64 << 10
)

// Policy is a VM's egress policy. The zero Policy allows everything.
// Parse makes CIDRs canonical (no host bits) and Domains lower case,
// without a trailing dot; a wildcard domain is "*.example.org". CIDRs
// and Domains are what an allow list lists (under DenyList, the
// exceptions); Deny is what a deny list lists.
type Policy struct {
	Mode    Mode
	CIDRs   []netip.Prefix
	Domains []string
	Deny    []netip.Prefix
}

// usage is what a bad policy's error says to write.
const usage = "use allow-all, deny-all, allow:LIST or deny:LIST[;allow:LIST] (comma-separated IPv4 addresses, CIDRs and domains; a deny list takes no domains)"

// Parse reads a policy: "allow-all", "deny-all", "allow:LIST" or
// "deny:LIST", optionally followed by ";allow:LIST" (what the deny list
// would block but may be reached); a LIST is comma-separated IPv4
// addresses, IPv4 CIDRs, domain names and wildcards such as
// *.example.org (a deny list takes no names: a name's addresses can be
// reached without it). Every error wraps ErrInvalid.
func Parse(s string) (Policy, error) {
	if len(s) > MaxLen {
		return Policy{}, fmt.Errorf("egress policy of %d bytes is too long: at most %d: %w", len(s), MaxLen, ErrInvalid)
	}
	s = strings.TrimSpace(s)
	switch s {
	case string(AllowAll):
		return Policy{Mode: AllowAll}, nil
	case string(DenyAll):
		return Policy{Mode: DenyAll}, nil
	}
	if list, ok := strings.CutPrefix(s, string(AllowList)+":"); ok {
		if strings.Contains(list, ";") {
			return Policy{}, fmt.Errorf("bad egress policy %s: ';' follows a deny list only (deny:LIST;allow:LIST): %w", validate.Quote(s), ErrInvalid)
		}
		cidrs, domains, err := parseList(s, list)
		if err != nil {
			return Policy{}, err
		}
		return Policy{Mode: AllowList, CIDRs: cidrs, Domains: domains}, nil
	}
	list, ok := strings.CutPrefix(s, string(DenyList)+":")
	if !ok {
		return Policy{}, fmt.Errorf("bad egress policy %s: %s: %w", validate.Quote(s), usage, ErrInvalid)
	}
	list, except, hasExcept := strings.Cut(list, ";")
	deny, domains, err := parseList(s, list)
	if err != nil {
		return Policy{}, err
	}
	if len(domains) > 0 {
		return Policy{}, fmt.Errorf("bad egress policy %s: a deny list takes IPv4 addresses and CIDRs, not %s (a name's addresses can be reached without it): %w",
			validate.Quote(s), validate.Quote(domains[0]), ErrInvalid)
	}
	p := Policy{Mode: DenyList, Deny: deny}
	if hasExcept {
		allow, ok := strings.CutPrefix(strings.TrimSpace(except), string(AllowList)+":")
		if !ok {
			return Policy{}, fmt.Errorf("bad egress policy %s: after a deny list's ';' comes allow:LIST (what it may reach even so): %w", validate.Quote(s), ErrInvalid)
		}
		if p.CIDRs, p.Domains, err = parseList(s, allow); err != nil {
			return Policy{}, err
		}
	}
	return p, nil
}

// parseList reads the comma-separated list of policy s: its CIDRs in
// address order and its domains in alphabetical order, each once.
func parseList(s, list string) ([]netip.Prefix, []string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil, fmt.Errorf("bad egress policy %s: the list is empty (use deny-all to block everything, allow-all to block nothing): %w", validate.Quote(s), ErrInvalid)
	}
	var cidrs []netip.Prefix
	var domains []string
	seen := map[string]bool{}
	for i, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, nil, fmt.Errorf("bad egress policy %s: entry %d is empty (remove the extra comma): %w", validate.Quote(s), i+1, ErrInvalid)
		}
		cidr, domain, err := parseEntry(e)
		if err != nil {
			return nil, nil, err
		}
		key := domain
		if domain == "" {
			key = cidr.String()
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		if len(seen) > MaxEntries {
			return nil, nil, fmt.Errorf("bad egress policy %s: more than %d entries: %w", validate.Quote(s), MaxEntries, ErrInvalid)
		}
		if domain != "" {
			domains = append(domains, domain)
		} else {
			cidrs = append(cidrs, cidr)
		}
	}
	slices.SortFunc(cidrs, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	slices.Sort(domains)
	return cidrs, domains, nil
}

// String is the policy's canonical form, which Parse reads back: CIDRs
// (a /32 as a bare address) in address order, then domains in
// alphabetical order. The zero Policy is "allow-all".
func (p Policy) String() string {
	switch p.Mode {
	case "", AllowAll:
		return string(AllowAll)
	case AllowList:
		return string(AllowList) + ":" + listString(p.CIDRs, p.Domains)
	case DenyList:
		s := string(DenyList) + ":" + listString(p.Deny, nil)
		if len(p.CIDRs)+len(p.Domains) > 0 {
			s += ";" + string(AllowList) + ":" + listString(p.CIDRs, p.Domains)
		}
		return s
	}
	return string(p.Mode)
}

// listString is a list as Parse reads it.
func listString(cidrs []netip.Prefix, domains []string) string {
	entries := make([]string, 0, len(cidrs)+len(domains))
	for _, c := range cidrs {
		if c.IsSingleIP() {
			entries = append(entries, c.Addr().String())
		} else {
			entries = append(entries, c.String())
		}
	}
	return strings.Join(append(entries, domains...), ",")
}

// MarshalText is String, refused (ErrInvalid) when Parse would not read
// it back, e.g. for an allow list with no entries.
func (p Policy) MarshalText() ([]byte, error) {
	s := p.String()
	if _, err := Parse(s); err != nil {
		return nil, err
	}
	return []byte(s), nil
}

// UnmarshalText is Parse; empty text is the zero Policy (allow-all),
// as when the field is absent.
func (p *Policy) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*p = Policy{}
		return nil
	}
	q, err := Parse(string(text))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// clone is p with slices of its own.
func (p Policy) clone() Policy {
	p.CIDRs = slices.Clone(p.CIDRs)
	p.Domains = slices.Clone(p.Domains)
	p.Deny = slices.Clone(p.Deny)
	return p
}

// AllowsName says whether the VM may resolve name: always under
// AllowAll and DenyList, never under DenyAll, and under AllowList when
// Lists(name).
func (p Policy) AllowsName(name string) bool {
	switch p.Mode {
	case "", AllowAll, DenyList:
		return true
	case AllowList:
		return p.Lists(name)
	}
	return false
}

// Lists says whether a listed domain is name itself or a wildcard "*.D"
// with name under D (not D itself); case and a trailing dot do not
// matter. The addresses such a name resolves to may be reached (under
// AllowList and DenyList).
func (p Policy) Lists(name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, d := range p.Domains {
		if suffix, ok := strings.CutPrefix(d, "*"); ok {
			if len(name) > len(suffix) && strings.HasSuffix(name, suffix) {
				return true
			}
		} else if name == d {
			return true
		}
	}
	return false
}

// AllowsAddr says whether the policy's CIDRs let the VM reach a: always
// under AllowAll, never under DenyAll; under AllowList when a listed
// CIDR holds it; under DenyList unless a Deny CIDR holds it and no
// listed CIDR does. Addresses that the listed domains admit through DNS
// answers are not the policy's: the firewall holds them.
func (p Policy) AllowsAddr(a netip.Addr) bool {
	a = a.Unmap()
	in := func(ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(c netip.Prefix) bool { return c.Contains(a) })
	}
	switch p.Mode {
	case "", AllowAll:
		return true
	case AllowList:
		return in(p.CIDRs)
	case DenyList:
		return in(p.CIDRs) || !in(p.Deny)
	}
	return false
}
