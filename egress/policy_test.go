package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	pfx := netip.MustParsePrefix
	for _, c := range []struct {
		in   string
		want Policy
	}{
		{"allow-all", Policy{Mode: AllowAll}},
		{"deny-all", Policy{Mode: DenyAll}},
		{" deny-all\n", Policy{Mode: DenyAll}},
		{"allow:github.com", Policy{Mode: AllowList, Domains: []string{"github.com"}}},
		{"allow:10.0.0.1", Policy{Mode: AllowList, CIDRs: []netip.Prefix{pfx("10.0.0.1/32")}}},
		{"allow:GitHub.COM.,*.Example.org,10.0.0.0/8, 192.168.1.7 ,0.0.0.0/0",
			Policy{Mode: AllowList,
				CIDRs:   []netip.Prefix{pfx("0.0.0.0/0"), pfx("10.0.0.0/8"), pfx("192.168.1.7/32")},
				Domains: []string{"*.example.org", "github.com"}}},
		{"allow:a.com,A.com,a.com.,10.0.0.1,10.0.0.1/32", Policy{Mode: AllowList,
			CIDRs: []netip.Prefix{pfx("10.0.0.1/32")}, Domains: []string{"a.com"}}},
		{"allow:localhost,xn--bcher-kva.de,a-b.c0,1a", Policy{Mode: AllowList,
			Domains: []string{"1a", "a-b.c0", "localhost", "xn--bcher-kva.de"}}},
		{"allow:" + strings.Repeat("a", 63) + ".com", Policy{Mode: AllowList,
			Domains: []string{strings.Repeat("a", 63) + ".com"}}},
		{"deny:169.254.169.254", Policy{Mode: DenyList, Deny: []netip.Prefix{pfx("169.254.169.254/32")}}},
		{" deny:10.0.0.0/8, 8.8.8.8 ; allow: 10.1.2.3,Example.ORG,10.1.2.3 ", Policy{Mode: DenyList,
			Deny: []netip.Prefix{pfx("8.8.8.8/32"), pfx("10.0.0.0/8")}, CIDRs: []netip.Prefix{pfx("10.1.2.3/32")}, Domains: []string{"example.org"}}},
	} {
		got, err := Parse(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %#v, %v; want %#v", c.in, got, err, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	long := strings.Repeat("a.", 126) + "ab" // 254 characters
	many := make([]string, MaxEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.example", i)
	}
	domainRule := "not an IPv4 address, CIDR or domain name (domain labels are 1-63 letters, digits and '-', not starting or ending with '-')"
	for _, c := range []struct{ in, want string }{
		{"", `bad egress policy "": use allow-all, deny-all, allow:LIST or deny:LIST[;allow:LIST] (comma-separated IPv4 addresses, CIDRs and domains; a deny list takes no domains)`},
		{"allow", `bad egress policy "allow": use allow-all, deny-all, allow:LIST or deny:LIST[;allow:LIST] (comma-separated IPv4 addresses, CIDRs and domains; a deny list takes no domains)`},
		{"Allow-All", `bad egress policy "Allow-All": use allow-all, deny-all, allow:LIST or deny:LIST[;allow:LIST] (comma-separated IPv4 addresses, CIDRs and domains; a deny list takes no domains)`},
		{"deny:a.com", `bad egress policy "deny:a.com": a deny list takes IPv4 addresses and CIDRs, not "a.com" (a name's addresses can be reached without it)`},
		{"deny:10.0.0.0/8,*.a.com", `bad egress policy "deny:10.0.0.0/8,*.a.com": a deny list takes IPv4 addresses and CIDRs, not "*.a.com" (a name's addresses can be reached without it)`},
		{"deny:", `bad egress policy "deny:": the list is empty (use deny-all to block everything, allow-all to block nothing)`},
		{"deny:10.0.0.0/8;", `bad egress policy "deny:10.0.0.0/8;": after a deny list's ';' comes allow:LIST (what it may reach even so)`},
		{"deny:10.0.0.0/8;deny:1.2.3.4", `bad egress policy "deny:10.0.0.0/8;deny:1.2.3.4": after a deny list's ';' comes allow:LIST (what it may reach even so)`},
		{"deny:10.0.0.0/8;allow:", `bad egress policy "deny:10.0.0.0/8;allow:": the list is empty (use deny-all to block everything, allow-all to block nothing)`},
		{"deny:10.0.0.1/8", `bad egress entry "10.0.0.1/8": host bits are set (use 10.0.0.0/8)`},
		{"allow:a.com;allow:b.com", `bad egress policy "allow:a.com;allow:b.com": ';' follows a deny list only (deny:LIST;allow:LIST)`},
		{"allow:", `bad egress policy "allow:": the list is empty (use deny-all to block everything, allow-all to block nothing)`},
		{"allow: ", `bad egress policy "allow:": the list is empty (use deny-all to block everything, allow-all to block nothing)`},
		{"allow:a.com,,b.com", `bad egress policy "allow:a.com,,b.com": entry 2 is empty (remove the extra comma)`},
		{"allow:a.com,", `bad egress policy "allow:a.com,": entry 2 is empty (remove the extra comma)`},
		{"allow:ex ample.com", `bad egress entry "ex ample.com": ` + domainRule},
		{"allow:-a.com", `bad egress entry "-a.com": ` + domainRule},
		{"allow:a-.com", `bad egress entry "a-.com": ` + domainRule},
		{"allow:a..com", `bad egress entry "a..com": ` + domainRule},
		{"allow:a_b.com", `bad egress entry "a_b.com": ` + domainRule},
		{"allow:bücher.de", `bad egress entry "bücher.de": ` + domainRule},
		{"allow:.", `bad egress entry ".": ` + domainRule},
		{"allow:a.com..", `bad egress entry "a.com..": ` + domainRule},
		{"allow:" + strings.Repeat("a", 64) + ".com", `bad egress entry "` + strings.Repeat("a", 64) + `"... (68 bytes): ` + domainRule},
		{"allow:" + long, `bad egress entry "` + long[:64] + `"... (254 bytes): a domain name is at most 253 characters`},
		{"allow:*", `bad egress entry "*": a wildcard needs a domain (e.g. *.example.org; allow-all allows everything)`},
		{"allow:*.", `bad egress entry "*.": a wildcard needs a domain (e.g. *.example.org; allow-all allows everything)`},
		{"allow:a.*.com", `bad egress entry "a.*.com": '*' may only be the whole leftmost label (e.g. *.example.org)`},
		{"allow:*a.com", `bad egress entry "*a.com": '*' may only be the whole leftmost label (e.g. *.example.org)`},
		{"allow:*.*.com", `bad egress entry "*.*.com": '*' may only be the whole leftmost label (e.g. *.example.org)`},
		{"allow:10.0.0.1/8", `bad egress entry "10.0.0.1/8": host bits are set (use 10.0.0.0/8)`},
		{"allow:192.168.1.1/24", `bad egress entry "192.168.1.1/24": host bits are set (use 192.168.1.0/24)`},
		{"allow:10.0.0.0/33", `bad egress entry "10.0.0.0/33": not an IPv4 CIDR (e.g. 10.0.0.0/8)`},
		{"allow:10.0.0.0/", `bad egress entry "10.0.0.0/": not an IPv4 CIDR (e.g. 10.0.0.0/8)`},
		{"allow:github.com/x", `bad egress entry "github.com/x": not an IPv4 CIDR (e.g. 10.0.0.0/8)`},
		{"allow:10.0.0.256", `bad egress entry "10.0.0.256": not an IPv4 address (four numbers 0-255 without leading zeros, e.g. 10.0.0.1)`},
		{"allow:010.0.0.1", `bad egress entry "010.0.0.1": not an IPv4 address (four numbers 0-255 without leading zeros, e.g. 10.0.0.1)`},
		{"allow:10.1", `bad egress entry "10.1": not an IPv4 address (four numbers 0-255 without leading zeros, e.g. 10.0.0.1)`},
		{"allow:2001:db8::1", `bad egress entry "2001:db8::1": IPv6 is not supported (vms have no IPv6 route)`},
		{"allow:2001:db8::/32", `bad egress entry "2001:db8::/32": IPv6 is not supported (vms have no IPv6 route)`},
		{"allow:::ffff:10.0.0.1", `bad egress entry "::ffff:10.0.0.1": IPv6 is not supported (vms have no IPv6 route)`},
		{"allow:github.com:443", `bad egress entry "github.com:443": not an IPv4 address, CIDR or domain name (no ports or URLs: e.g. 10.0.0.1, 10.0.0.0/8, github.com)`},
		{"allow:https://github.com", `bad egress entry "https://github.com": not an IPv4 address, CIDR or domain name (no ports or URLs: e.g. 10.0.0.1, 10.0.0.0/8, github.com)`},
		{"allow:" + strings.Join(many, ","), `bad egress policy "allow:h0.example,h1.example,h2.example,h3.example,h4.example,h5."... (3236 bytes): more than 256 entries`},
		{"allow:" + strings.Repeat("a,", MaxLen), fmt.Sprintf("egress policy of %d bytes is too long: at most %d", 6+2*MaxLen, MaxLen)},
	} {
		_, err := Parse(c.in)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%.80q) = %v, want ErrInvalid", c.in, err)
			continue
		}
		if want := c.want + ": invalid"; err.Error() != want {
			t.Errorf("Parse(%.80q):\n got %s\nwant %s", c.in, err, want)
		}
	}
	// Duplicates do not count against MaxEntries.
	if _, err := Parse("allow:" + strings.Repeat("a.com,", 2*MaxEntries) + strings.Join(many[:MaxEntries-1], ",")); err != nil {
		t.Errorf("256 distinct entries with duplicates: %v", err)
	}
}

func TestString(t *testing.T) {
	for _, c := range []struct {
		p    Policy
		want string
	}{
		{Policy{}, "allow-all"},
		{Policy{Mode: AllowAll}, "allow-all"},
		{Policy{Mode: DenyAll}, "deny-all"},
	} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%#v.String() = %q, want %q", c.p, got, c.want)
		}
	}
	for _, in := range []string{
		"allow-all", "deny-all", "allow:github.com",
		"allow:b.com,*.a.com,10.1.0.0/16,10.0.0.1,A.com.,10.0.0.0/8,0.0.0.0/0,10.0.0.0/16",
		"deny:169.254.169.254", "deny:10.0.0.0/8,1.1.1.1;allow:*.a.com,10.0.0.1",
	} {
		p, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		s := p.String()
		q, err := Parse(s)
		if err != nil || !reflect.DeepEqual(p, q) {
			t.Errorf("Parse(%q).String() = %q parses to %#v, %v", in, s, q, err)
		}
		if s2 := q.String(); s2 != s {
			t.Errorf("String is not canonical: %q then %q", s, s2)
		}
	}
	p, _ := Parse("allow:b.com,*.a.com,10.1.0.0/16,10.0.0.1,A.com.,10.0.0.0/8")
	if got, want := p.String(), "allow:10.0.0.0/8,10.0.0.1,10.1.0.0/16,*.a.com,a.com,b.com"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	p, _ = Parse("deny:10.0.0.0/8, 1.1.1.1 ;allow:B.com,10.0.0.1")
	if got, want := p.String(), "deny:1.1.1.1,10.0.0.0/8;allow:10.0.0.1,b.com"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestJSON(t *testing.T) {
	type vm struct {
		Egress Policy `json:"egress"`
	}
	p, _ := Parse("allow:github.com,10.0.0.0/8")
	b, err := json.Marshal(vm{p})
	if err != nil || string(b) != `{"egress":"allow:10.0.0.0/8,github.com"}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	var got vm
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got.Egress, p) {
		t.Errorf("Unmarshal = %#v, %v", got.Egress, err)
	}
	for in, want := range map[string]Policy{`{}`: {}, `{"egress":""}`: {}, `{"egress":"deny-all"}`: {Mode: DenyAll}} {
		got := vm{Egress: Policy{Mode: DenyAll, Domains: []string{"x"}}}
		if in == `{}` {
			got = vm{}
		}
		if err := json.Unmarshal([]byte(in), &got); err != nil || !reflect.DeepEqual(got.Egress, want) {
			t.Errorf("Unmarshal(%s) = %#v, %v", in, got.Egress, err)
		}
	}
	if err := json.Unmarshal([]byte(`{"egress":"allow:"}`), &got); !errors.Is(err, ErrInvalid) {
		t.Errorf("Unmarshal of a bad policy: %v", err)
	}
	if b, err := json.Marshal(vm{}); err != nil || string(b) != `{"egress":"allow-all"}` {
		t.Errorf("Marshal of the zero policy = %s, %v", b, err)
	}
	if _, err := json.Marshal(vm{Policy{Mode: AllowList}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Marshal of an empty allow list: %v", err)
	}
}

func TestAllowsName(t *testing.T) {
	p, err := Parse("allow:github.com,*.example.org,10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"github.com": true, "GitHub.Com.": true, "github.com.": true,
		"api.github.com": false, "agithub.com": false, "github.co": false, "com": false,
		"a.example.org": true, "A.B.Example.Org.": true, "example.org": false, "example.org.": false,
		"aexample.org": false, "a.example.org.evil": false, "": false, ".": false, "10.0.0.1": false,
	} {
		if got := p.AllowsName(name); got != want {
			t.Errorf("allow list AllowsName(%q) = %v, want %v", name, got, want)
		}
	}
	for _, name := range []string{"github.com", "anything.example", ""} {
		if !(Policy{}).AllowsName(name) || !(Policy{Mode: AllowAll}).AllowsName(name) {
			t.Errorf("allow-all refuses %q", name)
		}
		if (Policy{Mode: DenyAll}).AllowsName(name) || (Policy{Mode: "bogus", Domains: []string{name}}).AllowsName(name) {
			t.Errorf("deny-all (or an unknown mode) allows %q", name)
		}
	}
}

func TestAllowsAddr(t *testing.T) {
	p, err := Parse("allow:10.0.0.0/8,192.168.1.7,github.com")
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"10.0.0.0": true, "10.255.255.255": true, "11.0.0.0": false, "9.255.255.255": false,
		"192.168.1.7": true, "192.168.1.8": false, "::ffff:10.1.2.3": true, "2001:db8::1": false,
	} {
		if got := p.AllowsAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("AllowsAddr(%s) = %v, want %v", a, got, want)
		}
	}
	a := netip.MustParseAddr("1.2.3.4")
	if !(Policy{}).AllowsAddr(a) || !(Policy{Mode: AllowAll}).AllowsAddr(a) {
		t.Error("allow-all refuses an address")
	}
	if (Policy{Mode: DenyAll}).AllowsAddr(a) || (Policy{Mode: AllowList}).AllowsAddr(a) {
		t.Error("deny-all or an empty allow list allows an address")
	}
	// A deny list: everything but its list, its exceptions winning.
	d, err := Parse("deny:10.0.0.0/8,169.254.169.254;allow:10.1.2.3,10.2.0.0/16,github.com")
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"10.0.0.1": false, "10.255.255.255": false, "169.254.169.254": false, "169.254.169.253": true,
		"10.1.2.3": true, "10.1.2.4": false, "10.2.9.9": true, "1.2.3.4": true, "::ffff:10.0.0.1": false,
	} {
		if got := d.AllowsAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("deny list AllowsAddr(%s) = %v, want %v", a, got, want)
		}
	}
}

func TestDenyListNames(t *testing.T) {
	d, err := Parse("deny:10.0.0.0/8;allow:*.github.com,example.org")
	if err != nil {
		t.Fatal(err)
	}
	// Every name resolves under a deny list; the listed ones open their
	// addresses even inside the denied CIDRs.
	for name, listed := range map[string]bool{"api.github.com.": true, "github.com": false, "EXAMPLE.org": true, "other.test": false} {
		if !d.AllowsName(name) {
			t.Errorf("a deny list refuses the name %q", name)
		}
		if got := d.Lists(name); got != listed {
			t.Errorf("Lists(%q) = %v, want %v", name, got, listed)
		}
	}
}
