//go:build linux

package sysinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NetConfig is the static network configuration from the kernel command
// line (den.ip=ADDR/PREFIX den.gw=GW den.dns=IP).
type NetConfig struct {
	Interface string // default eth0
	IP        string
	GW        string
	DNS       []string
	// ResolvConf is where DNS servers are written (/etc/resolv.conf).
	ResolvConf string
}

// ConfigureNetwork brings lo up and, if c.IP is set, configures the
// interface, the default route and /etc/resolv.conf.
func ConfigureNetwork(log *slog.Logger, c NetConfig) error {
	nl, err := openNetlink()
	if err != nil {
		return err
	}
	defer nl.close()
	var errs []error
	if err := nl.linkUp("lo"); err != nil {
		errs = append(errs, err)
	}
	if c.IP == "" {
		return errors.Join(errs...)
	}
	ifname := c.Interface
	if ifname == "" {
		ifname = "eth0"
	}
	// The NIC's driver may still be probing.
	for i := 0; i < 100; i++ {
		if _, err := net.InterfaceByName(ifname); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := nl.configure(ifname, c.IP, c.GW); err != nil {
		errs = append(errs, err)
	} else {
		log.Info("network configured", "interface", ifname, "ip", c.IP, "gw", c.GW)
	}
	if err := writeResolvConf(c); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// netlinkConn is a NETLINK_ROUTE socket for a few requests.
type netlinkConn struct {
	fd  int
	seq uint32
}

func openNetlink() (*netlinkConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink: %w", err)
	}
	tv := unix.Timeval{Sec: 5}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return &netlinkConn{fd: fd}, nil
}

func (n *netlinkConn) close() { unix.Close(n.fd) }

// openLink opens a netlink socket for requests about interface ifname.
func openLink(ifname string) (*netlinkConn, *net.Interface, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, nil, err
	}
	nl, err := openNetlink()
	if err != nil {
		return nil, nil, err
	}
	return nl, ifi, nil
}

// configure sets cidr on ifname, brings it up and adds a default route
// via gw (if any).
func (n *netlinkConn) configure(ifname, cidr, gw string) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("configure %s: %w", ifname, err)
	}
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return fmt.Errorf("configure %s: den.ip: %w", ifname, err)
	}
	if err := n.linkUp(ifname); err != nil {
		return err
	}
	if err := n.addAddr(ifi.Index, pfx); err != nil {
		return fmt.Errorf("configure %s: add %s: %w", ifname, cidr, err)
	}
	if gw == "" {
		return nil
	}
	gwIP, err := netip.ParseAddr(gw)
	if err != nil {
		return fmt.Errorf("configure %s: den.gw: %w", ifname, err)
	}
	if err := n.addDefaultRoute(ifi.Index, gwIP); err != nil {
		return fmt.Errorf("configure %s: default route via %s: %w", ifname, gw, err)
	}
	return nil
}

func (n *netlinkConn) linkUp(ifname string) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("link %s up: %w", ifname, err)
	}
	// struct ifinfomsg: family, pad, type u16, index i32, flags u32, change u32
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], uint32(ifi.Index))
	binary.NativeEndian.PutUint32(b[8:], unix.IFF_UP)
	binary.NativeEndian.PutUint32(b[12:], unix.IFF_UP)
	if err := n.do(unix.RTM_NEWLINK, 0, b); err != nil {
		return fmt.Errorf("link %s up: %w", ifname, err)
	}
	return nil
}

func family(a netip.Addr) byte {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func (n *netlinkConn) addAddr(index int, p netip.Prefix) error {
	a := p.Addr().Unmap()
	// struct ifaddrmsg: family, prefixlen, flags, scope, index u32
	b := []byte{family(a), byte(p.Bits()), 0, unix.RT_SCOPE_UNIVERSE, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	b = appendAttr(b, unix.IFA_LOCAL, a.AsSlice())
	b = appendAttr(b, unix.IFA_ADDRESS, a.AsSlice())
	err := n.do(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, b)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

func (n *netlinkConn) addDefaultRoute(index int, gw netip.Addr) error {
	gw = gw.Unmap()
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags u32
	b := []byte{family(gw), 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST, 0, 0, 0, 0}
	b = appendAttr(b, unix.RTA_GATEWAY, gw.AsSlice())
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, uint32(index))
	b = appendAttr(b, unix.RTA_OIF, oif)
	// Replace: a reconfigured interface's old default route goes.
	return n.do(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, b)
}

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	l := 4 + len(data)
	hdr := make([]byte, 4)
	binary.NativeEndian.PutUint16(hdr[0:], uint16(l))
	binary.NativeEndian.PutUint16(hdr[2:], typ)
	b = append(b, hdr...)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// do sends one request and waits for its acknowledgement.
func (n *netlinkConn) do(typ, flags uint16, body []byte) error {
	n.seq++
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	binary.NativeEndian.PutUint32(msg[8:], n.seq)
	msg = append(msg, body...)
	if err := unix.Sendto(n.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 16384)
	for {
		nr, _, err := unix.Recvfrom(n.fd, buf, 0)
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:nr])
		if err != nil {
			return fmt.Errorf("netlink parse: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != n.seq || m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
				return syscall.Errno(-e)
			}
			return nil
		}
	}
}

// SetMAC gives a network interface a new hardware address (a fork's own:
// the device state restored from its source's memory holds the source's).
func SetMAC(ifname string, mac net.HardwareAddr) error {
	nl, ifi, err := openLink(ifname)
	if err != nil {
		return fmt.Errorf("set mac of %s: %w", ifname, err)
	}
	defer nl.close()
	if ifi.HardwareAddr.String() == mac.String() {
		return nil
	}
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], uint32(ifi.Index))
	b = appendAttr(b, unix.IFLA_ADDRESS, mac)
	if err := nl.do(unix.RTM_NEWLINK, 0, b); err != nil {
		return fmt.Errorf("set mac of %s to %s: %w", ifname, mac, err)
	}
	return nil
}

// Reconfigure replaces an interface's IPv4 addresses, default route and
// resolver by c's: a fork (or a VM created from a warm base) runs with its
// source's network until then.
func Reconfigure(log *slog.Logger, ifname string, c NetConfig) error {
	nl, ifi, err := openLink(ifname)
	if err != nil {
		return fmt.Errorf("reconfigure %s: %w", ifname, err)
	}
	defer nl.close()
	want, err := netip.ParsePrefix(c.IP)
	if err != nil {
		return fmt.Errorf("reconfigure %s: %w", ifname, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return fmt.Errorf("reconfigure %s: %w", ifname, err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(ipn.IP.To4())
		ones, _ := ipn.Mask.Size()
		p := netip.PrefixFrom(ip, ones)
		if p == want {
			continue
		}
		if err := nl.delAddr(ifi.Index, p); err != nil {
			return fmt.Errorf("reconfigure %s: remove %s: %w", ifname, p, err)
		}
	}
	if err := nl.configure(ifname, c.IP, c.GW); err != nil {
		return err
	}
	log.Info("network reconfigured", "interface", ifname, "ip", c.IP, "gw", c.GW)
	return writeResolvConf(c)
}

// writeResolvConf points the guest's resolver at c's DNS servers.
func writeResolvConf(c NetConfig) error {
	if len(c.DNS) == 0 {
		return nil
	}
	var b strings.Builder
	for _, d := range c.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	path := c.ResolvConf
	if path == "" {
		path = "/etc/resolv.conf"
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	return nil
}

func (n *netlinkConn) delAddr(index int, p netip.Prefix) error {
	a := p.Addr().Unmap()
	b := []byte{family(a), byte(p.Bits()), 0, unix.RT_SCOPE_UNIVERSE, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	b = appendAttr(b, unix.IFA_LOCAL, a.AsSlice())
	b = appendAttr(b, unix.IFA_ADDRESS, a.AsSlice())
	err := n.do(unix.RTM_DELADDR, 0, b)
	if errors.Is(err, unix.EADDRNOTAVAIL) {
		return nil
	}
	return err
}
