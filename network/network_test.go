package network

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/egress"
	"github.com/denhq/den/internal/netns"
	"github.com/denhq/den/internal/testutil"
)

func TestPool(t *testing.T) {
	p, err := ParsePool("10.200.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	if p.Slots() != 16384 {
		t.Fatalf("slots %d", p.Slots())
	}
	l := Lease{Subnet: p.Subnet(5), Tap: "dnx-5"}
	if l.Subnet.String() != "10.200.0.20/30" || l.HostIP().String() != "10.200.0.21" || l.GuestCIDR() != "10.200.0.22/30" {
		t.Fatalf("lease %v host %v guest %v", l.Subnet, l.HostIP(), l.GuestCIDR())
	}
	if l.HostMAC().String() != "02:de:0a:c8:00:15" {
		t.Fatalf("host mac %s", l.HostMAC())
	}
	if p.Slot(l.Subnet) != 5 || p.Slot(netip.MustParsePrefix("10.201.0.0/30")) != -1 {
		t.Fatal("slot")
	}
	for in, want := range map[string]string{
		"10.200.0.0/33": "want an IPv4 prefix",
		"10.200.0.1/16": "use 10.200.0.0/16",
		"fd00::/64":     "IPv4",
		"10.0.0.0/30":   "/8 to /29",
		"127.0.0.0/8":   "not a unicast range",
		"garbage":       "want an IPv4 prefix",
	} {
		if _, err := ParsePool(in); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParsePool(%q) = %v, want one line with %q", in, err, want)
		}
	}
}

func TestCmdline(t *testing.T) {
	g := Lease{Subnet: netip.MustParsePrefix("10.200.0.4/30"), Tap: "t"}.Guest()
	got := WithCmdline("console=ttyS0 den.ip=10.0.2.15/24 den.gw=10.0.2.2 den.dns=10.0.2.3 rw", g)
	if got != "console=ttyS0 rw den.ip=10.200.0.6/30 den.gw=10.200.0.5 den.dns=10.200.0.5" {
		t.Fatal(got)
	}
	for in, want := range map[string]string{"10.0.0.1": "10.0.0.1:53", "10.0.0.1:5353": "10.0.0.1:5353", "::1": "[::1]:53"} {
		if got, err := ParseUpstream(in); err != nil || got != want {
			t.Errorf("ParseUpstream(%q) = %q %v", in, got, err)
		}
	}
	if _, err := ParseUpstream("dns.example"); err == nil {
		t.Error("a name as upstream was taken")
	}
}

// TestTableScripts has nft check (-c: nothing is applied) every script
// den writes, in the order a daemon's life runs them.
func TestTableScripts(t *testing.T) {
	testutil.NeedRoot(t, "nft -c")
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft (make deps installs nftables)")
	}
	tb := table{name: "den_test", pool: netip.MustParsePrefix("10.200.0.0/16"), intercept: InterceptPort}
	pool, _ := ParsePool("10.200.0.0/16")
	allow, err := egress.Parse("allow:github.com,10.0.0.0/8,1.2.3.4,10.1.0.0/16,1.2.3.0/24")
	if err != nil {
		t.Fatal(err)
	}
	deny, err := egress.Parse("deny:10.0.0.0/8,169.254.169.254,10.9.0.0/16;allow:10.1.2.3,example.org")
	if err != nil {
		t.Fatal(err)
	}
	atts := []attachment{
		{vm: "a", slot: 0, lease: Lease{Subnet: pool.Subnet(0), Tap: "dntest-0"}},
		{vm: "b", slot: 1, lease: Lease{Subnet: pool.Subnet(1), Tap: "dntest-1"}, policy: allow},
		{vm: "c", slot: 7, lease: Lease{Subnet: pool.Subnet(7), Tap: "dntest-7"}, policy: egress.Policy{Mode: egress.DenyAll}},
		{vm: "d", slot: 3, lease: Lease{Subnet: pool.Subnet(3), Tap: "dntest-3"}, policy: deny},
	}
	script := tb.base(atts) +
		tb.vm(atts[0], false) + // re-attached as is
		tb.vm(atts[3], true) +
		tb.allow(1, []netip.Addr{netip.MustParseAddr("140.82.112.3"), netip.MustParseAddr("140.82.112.4")}, time.Minute) +
		tb.remove(7, "dntest-7") +
		tb.remove(9, "dntest-9") // never attached
	cmd := exec.Command("nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v\n%s\nscript:\n%s", err, out, script)
	}
	if !strings.Contains(script, "redirect to :17443") || !strings.Contains(script, "tcp dport 17443 ct status dnat socket mark 0x64656e accept") {
		t.Fatalf("no https interception:\n%s", script)
	}
	if !strings.Contains(script, "add element inet den_test cidr_1 { 10.0.0.0/8, 1.2.3.0/24 }") {
		t.Fatalf("overlapping prefixes are not collapsed:\n%s", script)
	}
	if !strings.Contains(script, "ip daddr @cidr_1 accept") || strings.Contains(tb.vm(atts[2], true), "@dns_7 accept") {
		t.Fatal("policies are not rendered as they say")
	}
	// A deny list: its exceptions first, then what it blocks.
	d := tb.vm(atts[3], true)
	for _, rule := range []string{"add element inet den_test block_3 { 10.0.0.0/8, 169.254.169.254/32 }", "add element inet den_test cidr_3 { 10.1.2.3/32 }"} {
		if !strings.Contains(d, rule) {
			t.Errorf("the deny list's script lacks %q:\n%s", rule, d)
		}
	}
	if i, j := strings.Index(d, "ip daddr @dns_3 accept"), strings.Index(d, "ip daddr != @block_3 accept"); i < 0 || j < i {
		t.Errorf("the deny list's rules are not its exceptions, then everything but its list:\n%s", d)
	}
	// Every drop of a VM's packets is counted and logged: to other VMs,
	// to the host, by the policy.
	for _, rule := range []string{"add rule inet den_test in_0 jump deny_0", "add rule inet den_test vm_0 ip daddr 10.200.0.0/16 jump deny_0",
		"add rule inet den_test vm_0 jump deny_0", `add rule inet den_test deny_0 counter name "denied_0" drop`} {
		if !strings.Contains(script, rule) {
			t.Errorf("the script lacks %q", rule)
		}
	}
}

// TestCarriedAddresses: in a network namespace of its own, a table with
// VMs in it (their other sets holding elements of other shapes) gives
// back the addresses each VM's resolver let through, by slot.
func TestCarriedAddresses(t *testing.T) {
	if err := netns.Usable(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft (make deps installs nftables)")
	}
	ns := fmt.Sprintf("dntest%d", os.Getpid()%100000)
	_ = exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	pool, _ := ParsePool("10.200.0.0/16")
	tb := table{name: "den_test", pool: pool.Prefix()}
	atts := []attachment{
		{vm: "a", slot: 0, lease: Lease{Subnet: pool.Subnet(0), Tap: "dntest-0"}},
		{vm: "b", slot: 3, lease: Lease{Subnet: pool.Subnet(3), Tap: "dntest-3"}},
	}
	a1, a2 := netip.MustParseAddr("140.82.112.3"), netip.MustParseAddr("140.82.112.4")
	var got map[int]map[netip.Addr]time.Duration
	err := netns.In(ns, func() error { // nft runs in the namespace of this thread
		if err := tb.run(context.Background(), tb.base(atts)+tb.allow(3, []netip.Addr{a1, a2}, time.Hour)); err != nil {
			return err
		}
		got = tb.dnsAllowed(context.Background())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[3]) != 2 || got[3][a1] < 59*time.Minute || got[3][a2] > time.Hour {
		t.Fatalf("carried addresses: %v", got)
	}
}
