package egress

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/denhq/den/internal/validate"
)

// maxName is the longest domain name, in characters, without the
// trailing dot.
const maxName = 253

// parseEntry reads one entry of a policy's list: an IPv4 address (a /32),
// a canonical IPv4 CIDR, or a domain name or wildcard, which it returns
// lower case without a trailing dot.
func parseEntry(e string) (netip.Prefix, string, error) {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("bad egress entry %s: %s: %w", validate.Quote(e), fmt.Sprintf(why, args...), ErrInvalid)
	}
	if strings.Contains(e, ":") {
		if _, err := netip.ParsePrefix(e); err == nil {
			return netip.Prefix{}, "", bad("IPv6 is not supported (vms have no IPv6 route)")
		}
		if _, err := netip.ParseAddr(e); err == nil {
			return netip.Prefix{}, "", bad("IPv6 is not supported (vms have no IPv6 route)")
		}
		return netip.Prefix{}, "", bad("not an IPv4 address, CIDR or domain name (no ports or URLs: e.g. 10.0.0.1, 10.0.0.0/8, github.com)")
	}
	if strings.Contains(e, "/") {
		c, err := netip.ParsePrefix(e)
		if err != nil || !c.Addr().Is4() {
			return netip.Prefix{}, "", bad("not an IPv4 CIDR (e.g. 10.0.0.0/8)")
		}
		if m := c.Masked(); m != c {
			return netip.Prefix{}, "", bad("host bits are set (use %s)", m)
		}
		return c, "", nil
	}
	if a, err := netip.ParseAddr(e); err == nil && a.Is4() {
		return netip.PrefixFrom(a, 32), "", nil
	}
	name := strings.ToLower(strings.TrimSuffix(e, "."))
	if len(name) > maxName {
		return netip.Prefix{}, "", bad("a domain name is at most %d characters", maxName)
	}
	labels := strings.Split(name, ".")
	if numeric(labels) {
		return netip.Prefix{}, "", bad("not an IPv4 address (four numbers 0-255 without leading zeros, e.g. 10.0.0.1)")
	}
	if strings.Contains(name, "*") {
		if labels[0] != "*" || strings.Contains(strings.Join(labels[1:], "."), "*") {
			return netip.Prefix{}, "", bad("'*' may only be the whole leftmost label (e.g. *.example.org)")
		}
		if len(labels) == 1 {
			return netip.Prefix{}, "", bad("a wildcard needs a domain (e.g. *.example.org; allow-all allows everything)")
		}
		labels = labels[1:]
	}
	for _, l := range labels {
		if !label(l) {
			return netip.Prefix{}, "", bad("not an IPv4 address, CIDR or domain name (domain labels are 1-63 letters, digits and '-', not starting or ending with '-')")
		}
	}
	return netip.Prefix{}, name, nil
}

// label says whether l is a DNS label: 1 to 63 of [a-z0-9-], not
// starting or ending with '-'.
func label(l string) bool {
	if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// numeric says whether every label is digits only: an IPv4 address
// meant, but not a valid one (no top-level domain is numeric).
func numeric(labels []string) bool {
	for _, l := range labels {
		if l == "" || strings.Trim(l, "0123456789") != "" {
			return false
		}
	}
	return true
}
