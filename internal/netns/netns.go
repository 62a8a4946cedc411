// Package netns makes network namespaces and runs code inside them: the
// stand-in, for den's tests and benchmarks, for a host running VMs and
// for "the internet" beyond it, so that no test traffic leaves the
// machine.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Addresses of a Pair.
const (
	DenUplink = "10.99.0.1" // the den namespace's side of the veth
	WANAddr   = "10.99.0.2" // the wan side, where servers listen
	WANHostA  = "10.99.1.1" // two more "internet" hosts on the wan's lo
	WANHostB  = "10.99.1.2"
)

// Pair is two namespaces joined by a veth pair: Den, where a den daemon
// runs (its TAPs, VM subnet, nftables table and NAT live there), and WAN,
// the world outside it.
//
//	Den: vd 10.99.0.1/24, default route via 10.99.0.2
//	WAN: vw 10.99.0.2/24; lo 10.99.1.1, 10.99.1.2
type Pair struct {
	Den, WAN string
}

// NewPair makes a pair named PREFIXden and PREFIXwan (any left by an
// earlier run with that prefix is removed first).
func NewPair(prefix string) (*Pair, error) {
	p := &Pair{Den: prefix + "den", WAN: prefix + "wan"}
	p.Close()
	for _, args := range [][]string{
		{"netns", "add", p.Den},
		{"netns", "add", p.WAN},
		{"link", "add", "vd", "netns", p.Den, "type", "veth", "peer", "name", "vw", "netns", p.WAN},
		{"-n", p.Den, "addr", "add", DenUplink + "/24", "dev", "vd"},
		{"-n", p.Den, "link", "set", "vd", "up"},
		{"-n", p.Den, "link", "set", "lo", "up"},
		{"-n", p.Den, "route", "add", "default", "via", WANAddr},
		{"-n", p.WAN, "addr", "add", WANAddr + "/24", "dev", "vw"},
		{"-n", p.WAN, "link", "set", "vw", "up"},
		{"-n", p.WAN, "link", "set", "lo", "up"},
		{"-n", p.WAN, "addr", "add", WANHostA + "/32", "dev", "lo"},
		{"-n", p.WAN, "addr", "add", WANHostB + "/32", "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			p.Close()
			return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return p, nil
}

// Close removes the namespaces (and with them their devices).
func (p *Pair) Close() {
	for _, ns := range []string{p.Den, p.WAN} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// LANAddr is the address of a LAN's servers namespace, on its bridge;
// its hosts are 10.98.0.11 and up.
const LANAddr = "10.98.0.1"

// LAN is a namespace per host of a cluster and one for the servers they
// share (a registry, object storage), on one bridge in the servers'
// namespace: a network of machines inside this one.
//
//	Servers: br0 10.98.0.1/24, lo
//	Hosts[i]: eth0 10.98.0.(11+i)/24, lo
type LAN struct {
	Servers string
	// Hosts are the hosts' namespaces, and Addrs their addresses, in
	// the order NewLAN was given their names.
	Hosts, Addrs []string
}

// NewLAN makes a LAN named PREFIXlan with a host namespace PREFIX+NAME
// per name (any left by an earlier run with these names is removed
// first).
func NewLAN(prefix string, names ...string) (*LAN, error) {
	l := &LAN{Servers: prefix + "lan"}
	for i, name := range names {
		l.Hosts = append(l.Hosts, prefix+name)
		l.Addrs = append(l.Addrs, fmt.Sprintf("10.98.0.%d", 11+i))
	}
	l.Close()
	cmds := [][]string{
		{"netns", "add", l.Servers},
		{"-n", l.Servers, "link", "set", "lo", "up"},
		{"-n", l.Servers, "link", "add", "name", "br0", "type", "bridge"},
		{"-n", l.Servers, "addr", "add", LANAddr + "/24", "dev", "br0"},
		{"-n", l.Servers, "link", "set", "br0", "up"},
	}
	for i, ns := range l.Hosts {
		port := fmt.Sprintf("vh%d", i)
		cmds = append(cmds,
			[]string{"netns", "add", ns},
			[]string{"link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", l.Servers},
			[]string{"-n", l.Servers, "link", "set", port, "master", "br0", "up"},
			[]string{"-n", ns, "addr", "add", l.Addrs[i] + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"})
	}
	for _, args := range cmds {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			l.Close()
			return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return l, nil
}

// Close removes the LAN's namespaces (and with them their devices).
func (l *LAN) Close() {
	for _, ns := range append([]string{l.Servers}, l.Hosts...) {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// In runs fn on a thread inside namespace ns; sockets fn makes stay in
// ns. The thread is never given back to the runtime (it ends with its
// goroutine), so nothing else runs in ns by accident.
func In(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := Enter(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Enter moves the calling thread, which must be locked to its goroutine
// and never given back to the runtime, into namespace ns ("": it stays).
func Enter(ns string) error {
	if ns == "" {
		return nil
	}
	f, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	return nil
}

// Listen listens on addr inside namespace ns.
func Listen(ns, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := In(ns, func() (err error) { ln, err = net.Listen(network, addr); return })
	return ln, err
}

// ListenPacket listens for packets on addr inside namespace ns.
func ListenPacket(ns, network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := In(ns, func() (err error) { pc, err = net.ListenPacket(network, addr); return })
	return pc, err
}

// Dialer dials from inside namespace ns (for an http.Transport).
func Dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := In(ns, func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, network, addr)
			return
		})
		return c, err
	}
}

// Usable says why this host cannot make namespaces (not root, no ip
// command), nil if it can.
func Usable() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("no ip command (iproute2)")
	}
	return nil
}
