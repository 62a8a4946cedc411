package machine

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/network"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
)

// Network modes (NetworkConfig.Mode).
const (
	// NetAuto: a TAP per VM where the host allows it, else the VMM's
	// user-mode network.
	NetAuto = "auto"
	// NetTap: a TAP per VM, or the daemon does not start.
	NetTap = "tap"
	// NetUser: the VMM's user-mode network (QEMU only).
	NetUser = "user"
)

// NetworkConfig is how VMs reach the network.
type NetworkConfig struct {
	// Mode is NetAuto, NetTap or NetUser ("": NetUser, so that a zero
	// Config, in tests, leaves the host's network alone; den daemon's
	// default is NetAuto).
	Mode string
	// Pool is where VMs' subnets come from (network.DefaultPool).
	Pool network.Pool
	// DNSUpstreams are the resolvers behind the VMs' resolver (host:port;
	// empty: /etc/resolv.conf).
	DNSUpstreams []string
	// DefaultEgress is the policy of VMs created without one (allow-all
	// when zero).
	DefaultEgress egress.Policy
	// HTTPS, if set, takes over VMs' HTTPS connections to the names it
	// intercepts (den's HTTPS secrets; TAP networking only).
	HTTPS network.Interceptor
}

// tapWanted says whether VMs get TAP networking under c: no (why says
// why, for den doctor) where the mode is user, or auto on a host that
// cannot; an error where tap is asked for and the host cannot.
func tapWanted(c NetworkConfig) (use bool, why string, err error) {
	switch c.Mode {
	case NetAuto, NetTap:
	case "", NetUser: // a Config's zero value changes nothing on the host
		return false, "", nil
	default:
		return false, "", fmt.Errorf("bad network mode %q: use auto, tap or user: %w", c.Mode, ErrInvalid)
	}
	if err := network.Unavailable(); err != nil {
		if c.Mode == NetTap {
			return false, "", fmt.Errorf("network: tap networking asked for, but not possible here: %w", err)
		}
		return false, err.Error(), nil
	}
	return true, "", nil
}

// vmNet puts VMs on the host's TAP network: each VM's lease (its
// subnet and TAP) and egress policy.
type vmNet struct {
	host *network.Host // nil: VMs get the VMM's own network
	why  string        // why not TAP networking, for den doctor
	// egress is the policy of VMs that have none recorded.
	egress egress.Policy
	// userNet says whether a VMM has a network of its own (user mode).
	userNet func(vmmName string) bool
	log     *slog.Logger
	// db is the record, shared by the hosts of a cluster (shared): a
	// subnet is then one VM's across the cluster, so that a VM keeps
	// its address on whichever host it wakes.
	db     registry.Store
	shared bool
}

// setupNetwork opens the host network for the VMs on record (tap mode),
// or says why VMs use the VMM's own network. In a cluster, only the VMs
// whose VMM runs on this host go on it at start; the rest when they wake
// or boot here.
func (m *Manager) setupNetwork(ctx context.Context) error {
	c := m.cfg.Network
	m.net = vmNet{egress: c.DefaultEgress, log: m.log, userNet: func(name string) bool { return m.vmms.caps(name).UserNet },
		db: m.db, shared: m.cfg.Leases != nil}
	use, why, err := tapWanted(c)
	if err != nil || !use {
		if why != "" {
			m.net.why = why
			m.log.Warn("den: VMs get the VMM's user-mode network (no TAP): " + why)
		}
		return err
	}
	vms, err := m.db.ListVMs(ctx, "")
	if err != nil {
		return err
	}
	var on []network.VM
	for _, vm := range vms {
		sp, err := decodeSpec(vm)
		if err != nil || sp.Net == nil {
			continue
		}
		if m.net.shared && !vmm.Recorded(m.state.Run(vm.Name).PIDFile()) {
			// A cluster's VM goes on this host's network when it runs
			// here (up): at start, those whose VMM runs here already.
			continue
		}
		on = append(on, network.VM{Name: vm.Name, Lease: *sp.Net, Policy: m.net.policyOf(sp)})
	}
	nc := network.Config{Pool: c.Pool, ID: netID(m.state), DNSUpstreams: c.DNSUpstreams, Logger: m.log, HTTPS: c.HTTPS}
	if u := m.conf.user; u != nil {
		nc.TapUID, nc.TapGID = u.UID, u.GID
	}
	h, err := network.Open(ctx, nc, on)
	if err != nil {
		return err
	}
	m.net.host = h
	return nil
}

// netID tells this daemon's TAPs and table from another daemon's: a hash
// of its state directory.
func netID(state StateDir) string {
	h := fnv.New32a()
	h.Write([]byte(state.Path()))
	return fmt.Sprintf("%04x", h.Sum32()&0xffff)
}

// CheckNetwork is what a daemon checks before it mounts anything: that
// the network it is asked for can be had (TAP networking, and a pool no
// other network uses).
func CheckNetwork(state StateDir, c NetworkConfig) error {
	if use, _, err := tapWanted(c); err != nil || !use {
		return err
	}
	return network.CheckPool(c.Pool, netID(state))
}

// policyOf is a VM's egress policy (the daemon's default if it has none
// recorded, or a record that does not parse).
// nameOf is the name den's resolver answered vm for address a, if it
// remembers one.
func (n *vmNet) nameOf(vm string, a netip.Addr) string {
	if n.host == nil {
		return ""
	}
	return n.host.NameOf(vm, a)
}

func (n *vmNet) policyOf(sp spec) egress.Policy {
	if sp.Egress == "" {
		return n.egress
	}
	p, err := egress.Parse(sp.Egress)
	if err != nil {
		n.log.Warn("den: bad recorded egress policy, using the default", "policy", sp.Egress, "err", err)
		return n.egress
	}
	return p
}

// takeLease gives a new VM its own subnet and TAP (a fork gets new ones).
// Its undo gives back that lease and nothing else: never by name, which
// may be another VM's. In a cluster the subnets other hosts gave their
// VMs are passed by (learn); anywhere: see network.Host.Reserve.
func (n *vmNet) takeLease(ctx context.Context, name string, sp *spec, anywhere bool, undo *cleanups) error {
	sp.Net = nil
	if n.host == nil {
		return nil
	}
	if err := n.learn(ctx); err != nil {
		return err
	}
	l, err := n.host.Reserve(name, anywhere)
	if err != nil {
		return err
	}
	sp.Net = &l
	undo.push("release the network lease "+l.Tap+" of vm "+name, func() error {
		return n.host.Release(context.Background(), name, l)
	})
	return nil
}

// learn marks, in a cluster, every subnet the record gives a VM as held
// here: other hosts made VMs since this one started.
func (n *vmNet) learn(ctx context.Context) error {
	subnets, err := n.recorded(ctx)
	for vm, l := range subnets {
		n.host.Know(vm, l)
	}
	return err
}

// sharer is the VM other than name that the record gives subnet l too,
// if any: two hosts of a cluster that create VMs at once may both pick
// a subnet neither knew taken.
func (n *vmNet) sharer(ctx context.Context, name string, l network.Lease) (string, error) {
	subnets, err := n.recorded(ctx)
	for vm, other := range subnets {
		if vm != name && other.Subnet == l.Subnet {
			return vm, nil
		}
	}
	return "", err
}

// recorded is, in a cluster, the lease the record gives each VM that has
// one (nil on a host of its own, whose leases are all here).
func (n *vmNet) recorded(ctx context.Context) (map[string]network.Lease, error) {
	if !n.shared {
		return nil, nil
	}
	vms, err := n.db.ListVMs(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("network: the subnets of the cluster's vms: %w", err)
	}
	subnets := map[string]network.Lease{}
	for _, vm := range vms {
		if sp, err := decodeSpec(vm); err == nil && sp.Net != nil {
			subnets[vm.Name] = *sp.Net
		}
	}
	return subnets, nil
}

// dropLease gives back a lease takeLease took that the VM will not use
// after all (its undo then finds nothing to do).
func (n *vmNet) dropLease(ctx context.Context, name string, l *network.Lease) {
	if n.host == nil || l == nil {
		return
	}
	if err := n.host.Release(ctx, name, *l); err != nil {
		n.log.Warn("den: release a network lease", "vm", name, "tap", l.Tap, "err", err)
	}
}

// up puts a VM on its TAP before its VMM starts (it opens the TAP by
// name); VMs without a lease are left alone. In a cluster, a subnet held
// here by a VM the record no longer gives it (removed, or given another
// since on another host) is taken from that VM first.
func (n *vmNet) up(ctx context.Context, name string, sp spec) error {
	if n.host == nil || sp.Net == nil {
		return nil
	}
	err := n.host.Attach(ctx, name, *sp.Net, n.policyOf(sp))
	var taken *network.SubnetTakenError
	if errors.As(err, &taken) && n.shared {
		other, serr := n.sharer(ctx, name, *sp.Net)
		switch {
		case serr != nil:
			err = serr
		case other == "":
			n.log.Info("den: a subnet held here for a vm that no longer has it goes to the vm that has it", "subnet", taken.Subnet, "from", taken.VM, "to", name)
			if err = n.host.Detach(ctx, taken.VM); err == nil {
				err = n.host.Attach(ctx, name, *sp.Net, n.policyOf(sp))
			}
		default:
			err = fmt.Errorf("%w: the record gives it to vm %q too", err, other)
		}
	}
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// down takes a removed VM off the network.
func (n *vmNet) down(ctx context.Context, name string) {
	if n.host == nil {
		return
	}
	if err := n.host.Detach(ctx, name); err != nil {
		n.log.Warn("den: remove the network of a vm", "vm", name, "err", err)
	}
}

// guest is what a VM's guest is told of its network, and the VMM's
// network devices for it.
func (n *vmNet) guest(vm registry.VM, sp spec) (network.GuestConfig, []vmm.Net, bool) {
	if sp.Net != nil && n.host != nil {
		return sp.Net.Guest(), []vmm.Net{{ID: "net0", Tap: sp.Net.Tap, MAC: sp.MAC}}, true
	}
	if n.userNet != nil && n.userNet(vm.VMM) {
		return network.UserNet, []vmm.Net{{ID: "net0", MAC: sp.MAC}}, true
	}
	return network.GuestConfig{}, nil, false
}

// identity is the network a fork or a create from a warm base is told
// with its new identity (it runs with its source's until then).
func (n *vmNet) identity(vm registry.VM, sp spec) (mac string, nc *agent.NetConfig) {
	g, nets, ok := n.guest(vm, sp)
	if !ok {
		return "", nil
	}
	return nets[0].MAC, &agent.NetConfig{IP: g.IP, GW: g.GW, DNS: g.DNS}
}

// network says how VMs reach the network, for den info and doctor.
func (m *Manager) network() string {
	if m.net.host != nil {
		return m.net.host.String()
	}
	d := m.vmms.caps(m.vmmName).Network
	if m.net.why != "" {
		d += " (no tap: " + m.net.why + ")"
	}
	return d
}

// NetStatus is a VM's network, for den info and den net log.
type NetStatus struct {
	Mode   string
	IP     string
	Policy string
	Host   *network.Status
}

// NetStatus reads a VM's network state.
func (m *Manager) NetStatus(ctx context.Context, name string) (NetStatus, error) {
	vm, sp, err := m.getSpec(ctx, name)
	if err != nil {
		return NetStatus{}, err
	}
	st := NetStatus{}
	st.Mode, st.IP, st.Policy = m.net.summary(vm, sp)
	if st.Mode == "tap" {
		hs, err := m.net.host.Status(ctx, name)
		if err != nil {
			m.log.Debug("den: network status", "vm", name, "err", err)
		}
		st.Host = &hs
	}
	return st, nil
}

// summary is a VM's network mode ("tap", "user", "none"), address and
// egress policy (only a TAP enforces one).
func (n *vmNet) summary(vm registry.VM, sp spec) (mode, ip, policy string) {
	g, _, ok := n.guest(vm, sp)
	switch {
	case sp.Net != nil && n.host != nil:
		return "tap", g.IP, n.policyOf(sp).String()
	case ok:
		return "user", g.IP, "allow-all (user-mode network: not enforced)"
	}
	return "none", "", ""
}

// SetEgress changes a VM's egress policy, at once on a running VM.
func (m *Manager) SetEgress(ctx context.Context, name string, p egress.Policy) error {
	_, err := m.updateSpec(ctx, name, "egress policy", func(sp *spec) error {
		if sp.Net == nil || m.net.host == nil {
			return fmt.Errorf("it has no tap network, so no egress policy can be enforced (%s): %w", m.network(), ErrInvalid)
		}
		sp.Egress = p.String()
		if m.net.shared && !m.net.host.On(name) {
			return nil // asleep or stopped in a cluster: it goes on the network of the host it runs on next with it
		}
		// The rules change under the VM's lock, with the record.
		return m.net.host.SetPolicy(ctx, name, p)
	})
	if err != nil {
		return fmt.Errorf("set egress policy of vm %q: %w", name, err)
	}
	return nil
}
