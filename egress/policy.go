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
)

// Limits of a policy as written.
const (
	// MaxEntries is the most entries an allow list may have (after
	// duplicates are merged).
	MaxEntries = 256
	// MaxLen is the longest policy string Parse reads, in bytes.
	MaxLen = 64 << 10
)

// Policy is a VM's egress policy. The zero Policy allows everything.
// Parse makes CIDRs canonical (no host bits) and Domains lower case,
// without a trailing dot; a wildcard domain is "*.example.org".
type Policy struct {
	Mode    Mode
	CIDRs   []netip.Prefix
	Domains []string
}

// Parse reads a policy: "allow-all", "deny-all" or "allow:LIST", LIST
// being comma-separated IPv4 addresses, IPv4 CIDRs, domain names and
// wildcards such as *.example.org. Every error wraps ErrInvalid.
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
	list, ok := strings.CutPrefix(s, string(AllowList)+":")
	if !ok {
		return Policy{}, fmt.Errorf("bad egress policy %s: use allow-all, deny-all or allow:LIST (comma-separated IPv4 addresses, CIDRs and domains): %w", validate.Quote(s), ErrInvalid)
	}
	if strings.TrimSpace(list) == "" {
		return Policy{}, fmt.Errorf("bad egress policy %s: the list is empty (use deny-all to block everything): %w", validate.Quote(s), ErrInvalid)
	}
	p := Policy{Mode: AllowList}
	seen := map[string]bool{}
	for i, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return Policy{}, fmt.Errorf("bad egress policy %s: entry %d is empty (remove the extra comma): %w", validate.Quote(s), i+1, ErrInvalid)
		}
		cidr, domain, err := parseEntry(e)
		if err != nil {
			return Policy{}, err
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
			return Policy{}, fmt.Errorf("bad egress policy %s: more than %d entries: %w", validate.Quote(s), MaxEntries, ErrInvalid)
		}
		if domain != "" {
			p.Domains = append(p.Domains, domain)
		} else {
			p.CIDRs = append(p.CIDRs, cidr)
		}
	}
	slices.SortFunc(p.CIDRs, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	slices.Sort(p.Domains)
	return p, nil
}

// String is the policy's canonical form, which Parse reads back: CIDRs
// (a /32 as a bare address) in address order, then domains in
// alphabetical order. The zero Policy is "allow-all".
func (p Policy) String() string {
	switch p.Mode {
	case "", AllowAll:
		return string(AllowAll)
	case AllowList:
		entries := make([]string, 0, len(p.CIDRs)+len(p.Domains))
		for _, c := range p.CIDRs {
			if c.IsSingleIP() {
				entries = append(entries, c.Addr().String())
			} else {
				entries = append(entries, c.String())
			}
		}
		entries = append(entries, p.Domains...)
		return string(AllowList) + ":" + strings.Join(entries, ",")
	}
	return string(p.Mode)
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
	return p
}

// AllowsName says whether the VM may resolve name: always under
// AllowAll, never under DenyAll, and under AllowList when a domain is
// name itself or a wildcard "*.D" with name under D (not D itself).
// Case and a trailing dot do not matter.
func (p Policy) AllowsName(name string) bool {
	switch p.Mode {
	case "", AllowAll:
		return true
	case AllowList:
	default:
		return false
	}
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
// under AllowAll, never under DenyAll. Addresses that AllowList admits
// through DNS answers are not the policy's: the firewall holds them.
func (p Policy) AllowsAddr(a netip.Addr) bool {
	switch p.Mode {
	case "", AllowAll:
		return true
	case AllowList:
	default:
		return false
	}
	a = a.Unmap()
	for _, c := range p.CIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}
