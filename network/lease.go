// Package network gives each VM a TAP device with a routed /30 of its own,
// and NAT out through one nftables table that den owns and that enforces
// each VM's egress policy.
//
// The host side of a VM's /30 is the TAP's address (the guest's gateway
// and DNS server); the guest has the other usable address. Nothing is
// bridged: guests reach only what the table forwards for them, never each
// other nor the host's own services (the daemon's DNS resolver on the
// TAP's address excepted).
package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Lease is a VM's place on the host's network: its /30 and its TAP
// device. It is recorded with the VM and kept across sleeps, restores and
// daemon restarts; a fork gets a new one.
type Lease struct {
	// Subnet is the VM's /30 out of the pool.
	Subnet netip.Prefix `json:"subnet"`
	// Tap is the host's TAP device of the VM.
	Tap string `json:"tap"`
}

// SubnetBits is the size of each VM's subnet: a /30 holds the host's
// address and the guest's.
const SubnetBits = 30

// HostIP is the host side's address (the guest's gateway and resolver).
func (l Lease) HostIP() netip.Addr { return l.Subnet.Masked().Addr().Next() }

// HostMAC is the hardware address of the host side of the TAP: fixed by
// the host address (locally administered), so that a TAP made anew has
// the one the guest knows.
func (l Lease) HostMAC() net.HardwareAddr {
	a := l.HostIP().As4()
	return net.HardwareAddr{0x02, 0xde, a[0], a[1], a[2], a[3]}
}

// GuestIP is the guest's address.
func (l Lease) GuestIP() netip.Addr { return l.HostIP().Next() }

// GuestCIDR is the guest's address with its prefix ("10.200.0.6/30"), as
// the guest configures it.
func (l Lease) GuestCIDR() string { return netip.PrefixFrom(l.GuestIP(), SubnetBits).String() }

// Valid says whether the lease is complete.
func (l Lease) Valid() bool {
	return l.Subnet.IsValid() && l.Subnet.Bits() == SubnetBits && l.Tap != ""
}

// GuestConfig is what a guest is told of its network: address, gateway and
// DNS server, as den.ip=, den.gw= and den.dns= on its kernel command line
// (or through the agent after a restore of another VM's memory).
type GuestConfig struct {
	IP  string `json:"ip"`
	GW  string `json:"gw"`
	DNS string `json:"dns"`
}

// Guest is the guest's side of the lease.
func (l Lease) Guest() GuestConfig {
	h := l.HostIP().String()
	return GuestConfig{IP: l.GuestCIDR(), GW: h, DNS: h}
}

// Cmdline is the kernel command line arguments of a guest config.
func (g GuestConfig) Cmdline() []string {
	return []string{"den.ip=" + g.IP, "den.gw=" + g.GW, "den.dns=" + g.DNS}
}

// WithCmdline replaces any den.ip=, den.gw= and den.dns= arguments of a
// kernel command line by those of g.
func WithCmdline(cmdline string, g GuestConfig) string {
	var out []string
	for _, f := range strings.Fields(cmdline) {
		if strings.HasPrefix(f, "den.ip=") || strings.HasPrefix(f, "den.gw=") || strings.HasPrefix(f, "den.dns=") {
			continue
		}
		out = append(out, f)
	}
	return strings.Join(append(out, g.Cmdline()...), " ")
}

// UserNet is what a guest on QEMU's user-mode network is told: it is
// 10.0.2.15 behind QEMU's NAT.
var UserNet = GuestConfig{IP: "10.0.2.15/24", GW: "10.0.2.2", DNS: "10.0.2.3"}

// Pool is the address range VMs' subnets are taken from.
type Pool struct {
	prefix netip.Prefix
}

// DefaultPool is the pool of a daemon told none.
const DefaultPool = "10.200.0.0/16"

// ParsePool checks a pool: an IPv4 prefix in canonical form, between /8
// and /29 (at least two VMs).
func ParsePool(s string) (Pool, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Pool{}, fmt.Errorf("bad network pool %q: want an IPv4 prefix such as %s", s, DefaultPool)
	}
	if !p.Addr().Is4() {
		return Pool{}, fmt.Errorf("bad network pool %q: VMs get IPv4 subnets, give an IPv4 prefix such as %s", s, DefaultPool)
	}
	if p.Masked() != p {
		return Pool{}, fmt.Errorf("bad network pool %q: it has host bits set, use %s", s, p.Masked())
	}
	if p.Bits() < 8 || p.Bits() > SubnetBits-1 {
		return Pool{}, fmt.Errorf("bad network pool %q: the prefix must be /8 to /%d (each VM takes a /%d)", s, SubnetBits-1, SubnetBits)
	}
	if p.Addr().IsLoopback() || p.Addr().IsMulticast() || p.Addr().IsLinkLocalUnicast() || p.Addr().IsUnspecified() {
		return Pool{}, fmt.Errorf("bad network pool %q: not a unicast range a host can route", s)
	}
	return Pool{prefix: p}, nil
}

// orDefault is p, or DefaultPool for the zero Pool.
func (p Pool) orDefault() Pool {
	if p.prefix.IsValid() {
		return p
	}
	d, _ := ParsePool(DefaultPool) // a constant that parses
	return d
}

// Prefix is the pool's prefix.
func (p Pool) Prefix() netip.Prefix { return p.prefix }

// Slots is how many VM subnets the pool holds.
func (p Pool) Slots() int { return 1 << (SubnetBits - p.prefix.Bits()) }

// Subnet is the n-th VM subnet of the pool.
func (p Pool) Subnet(n int) netip.Prefix {
	b := p.prefix.Addr().As4()
	base := binary.BigEndian.Uint32(b[:]) + uint32(n)<<(32-SubnetBits)
	binary.BigEndian.PutUint32(b[:], base)
	return netip.PrefixFrom(netip.AddrFrom4(b), SubnetBits)
}

// Slot is the index of a subnet in the pool, -1 if it is not one of the
// pool's.
func (p Pool) Slot(s netip.Prefix) int {
	if !s.IsValid() || s.Bits() != SubnetBits || !p.prefix.Contains(s.Addr()) {
		return -1
	}
	a, b := s.Masked().Addr().As4(), p.prefix.Addr().As4()
	return int((binary.BigEndian.Uint32(a[:]) - binary.BigEndian.Uint32(b[:])) >> (32 - SubnetBits))
}

// ParseUpstream checks a resolver address: an IP with an optional port
// (53 when none), as host:port.
func ParseUpstream(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return "", fmt.Errorf("bad resolver %q: port 0", s)
		}
		return ap.String(), nil
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	if err != nil {
		return "", fmt.Errorf("bad resolver %q: want an IP address, with :PORT if not 53", s)
	}
	return netip.AddrPortFrom(a, 53).String(), nil
}
