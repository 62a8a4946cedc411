package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ensureTap makes the TAP device of a lease, with the host's address on
// it, up, owned by uid and gid (the unprivileged VMM opens it; 0: root's
// only). A device that is there already (a VM adopted after a daemon
// restart, whose VMM holds it) is kept; a missing address is added, and
// a device no VMM holds gets the owner.
func ensureTap(l Lease, uid, gid int) error {
	link, err := netlink.LinkByName(l.Tap)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: l.Tap},
			Mode:      netlink.TUNTAP_MODE_TAP,
			// One queue, no packet info, persistent: the VMM opens it
			// by name, and it outlives the VMM across sleeps.
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
			Owner: uint32(uid),
			Group: uint32(gid),
		}
		if err := netlink.LinkAdd(tap); err != nil {
			return fmt.Errorf("create tap %s: %w", l.Tap, err)
		}
		// netlink's Tuntap keeps the queue fds open; a persistent TAP
		// needs none, and a VMM must be the only one reading it.
		for _, f := range tap.Fds {
			f.Close()
		}
		if link, err = netlink.LinkByName(l.Tap); err != nil {
			return fmt.Errorf("tap %s: %w", l.Tap, err)
		}
		// The same hardware address every time the TAP is made: a guest
		// that slept through a reboot (its TAP made anew) still has the
		// gateway's address in its ARP cache.
		if err := netlink.LinkSetHardwareAddr(link, l.HostMAC()); err != nil {
			return fmt.Errorf("tap %s: hardware address: %w", l.Tap, err)
		}
	} else if err != nil {
		return fmt.Errorf("tap %s: %w", l.Tap, err)
	} else if link.Type() != "tuntap" {
		return fmt.Errorf("tap %s: a %s device has that name", l.Tap, link.Type())
	} else if t, ok := link.(*netlink.Tuntap); ok && (t.Owner != uint32(uid) || t.Group != uint32(gid)) {
		if err := setTapOwner(l.Tap, uid, gid); err != nil {
			return err
		}
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(l.HostIP(), SubnetBits))}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address %s on tap %s: %w", addr.IPNet, l.Tap, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("tap %s up: %w", l.Tap, err)
	}
	return nil
}

// setTapOwner gives an existing TAP device to uid and gid: attached for
// a moment, which fails (EBUSY, left as it is) while a VMM holds it.
func setTapOwner(name string, uid, gid int) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("tap %s owner: %w", name, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("tap %s owner: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil // its VMM has it open: it could open it
		}
		return fmt.Errorf("tap %s owner: attach: %w", name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, uid); err != nil {
		return fmt.Errorf("tap %s owner: %w", name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, gid); err != nil {
		return fmt.Errorf("tap %s group: %w", name, err)
	}
	return nil
}

// removeTap deletes a TAP device; one that is gone already is fine.
func removeTap(name string) error {
	link, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tap %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove tap %s: %w", name, err)
	}
	return nil
}

// taps lists the host's links whose names start with prefix.
func taps(prefix string) ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out, nil
}

// overlapping finds a route of the host that overlaps the pool and is
// not on one of den's own devices (prefix): another network, or another
// den daemon, uses those addresses.
func overlapping(pool netip.Prefix, prefix string) (string, error) {
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		return "", fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue // a default route covers everything
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		p := netip.PrefixFrom(dst.Unmap(), ones)
		if !p.Overlaps(pool) {
			continue
		}
		dev := ""
		if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			dev = link.Attrs().Name
		}
		if strings.HasPrefix(dev, prefix) {
			continue
		}
		return fmt.Sprintf("%s on %s", p, dev), nil
	}
	return "", nil
}

// checkTun says why this host cannot make TAP devices, nil if it can.
func checkTun() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("no /dev/net/tun: %w", err)
	}
	return f.Close()
}

// enableForwarding turns on IPv4 forwarding, without which the host
// routes nothing for its guests; it says whether it was off.
func enableForwarding() (bool, error) {
	const p = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(p)
	if err != nil {
		return false, fmt.Errorf("ip forwarding: %w", err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return false, nil
	}
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		return false, fmt.Errorf("turn on ip forwarding: %w", err)
	}
	return true, nil
}

// ipNet is p as the standard library's type.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
