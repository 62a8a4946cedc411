package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/denhq/den/egress"
)

// Config configures a Host.
type Config struct {
	// Pool is where VMs' subnets come from (DefaultPool when zero).
	Pool Pool
	// ID tells this daemon's devices and table from another's on the same
	// host: TAPs are "dn<ID>-<slot>", the table "den_<ID>" (up to 6
	// lower-case letters or digits).
	ID string
	// DNSUpstreams are the resolvers the VMs' resolver asks (host:port);
	// empty: the host's /etc/resolv.conf.
	DNSUpstreams []string
	// Logger gets what the host network does.
	Logger *slog.Logger
	// TapUID and TapGID own the VMs' TAP devices: the unprivileged user
	// VMMs run as (0: root).
	TapUID, TapGID int
	// HTTPS, if set, takes VMs' HTTPS connections to the names it
	// intercepts over: their resolver answers such a name with the VM's
	// gateway address, whose port 443 leads to InterceptPort there,
	// where HTTPS serves the VM.
	HTTPS Interceptor
}

// InterceptPort is the port of a VM's gateway address where its HTTPS
// connections to intercepted names arrive (its port 443 is redirected).
// The firewall lets them in only to a socket marked InterceptMark (a mark
// only root sets: no other process that took the port gets them).
const (
	InterceptPort = 17443
	InterceptMark = 0x64656e
)

// An Interceptor serves VMs' HTTPS connections to the names it takes.
type Interceptor interface {
	// Intercepts says whether vm's connections to name (lower case, no
	// trailing dot) go to the interceptor; it is asked once the vm's
	// policy allows the name.
	Intercepts(vm, name string) bool
	// Serve listens for vm's connections on addr, from guest only, on a
	// socket marked InterceptMark (again: in place of its listener
	// before, whose connections it closes). resolve is where the
	// interceptor may connect for the VM: a name's addresses that the
	// VM's policy lets it reach, never the host's own nor the VMs'.
	Serve(vm string, addr netip.AddrPort, guest netip.Addr, resolve func(ctx context.Context, name string) ([]netip.Addr, error)) error
	// Stop closes vm's listener and its connections.
	Stop(vm string)
}

// VM is what the host network holds for one VM: its lease and its egress
// policy.
type VM struct {
	Name   string
	Lease  Lease
	Policy egress.Policy
}

// Host is the host side of den's VM network: TAP devices, the nftables
// table and the VMs' DNS resolver. Its methods are safe for concurrent
// use. VMs keep their devices and rules while the daemon is down (their
// VMMs run on); a restart makes the table anew from the VMs' records and
// removes what no VM owns.
type Host struct {
	cfg   Config
	table table
	res   *egress.Resolver
	log   *slog.Logger

	// policyMu orders a VM's policy change against its resolver's
	// openings (an answer made under the old policy never opens the new
	// rules): one lock per slot modulo its length, so that VMs' openings
	// do not wait for each other's nft runs.
	policyMu [16]sync.Mutex

	mu    sync.Mutex
	slots map[int]string         // slot -> vm
	vms   map[string]*attachment // attached
	// opened is, per VM, until when its resolver's answers are let
	// through: an answer the table holds for long enough yet costs no
	// nft transaction.
	opened map[string]map[netip.Addr]time.Time
}

// Unavailable says why a host cannot give VMs TAP networking (no root,
// no /dev/net/tun, no nft), nil if it can.
func Unavailable() error {
	if err := checkTun(); err != nil {
		return err
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("no nft command (install Debian's nftables package)")
	}
	return nil
}

// Open takes over the host network for the VMs in vms (their records):
// forwarding on, a fresh table with every VM in it (addresses their
// resolvers let through are carried over from a table an earlier run
// left), their TAPs made where missing, their resolvers started, and
// every device of this daemon no VM owns removed.
func Open(ctx context.Context, cfg Config, vms []VM) (*Host, error) {
	cfg.Pool = cfg.Pool.orDefault()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if !validID(cfg.ID) {
		return nil, fmt.Errorf("network: bad id %q: 1 to 6 lower-case letters or digits", cfg.ID)
	}
	if err := Unavailable(); err != nil {
		return nil, fmt.Errorf("network: tap networking is not possible here: %w", err)
	}
	var intercept uint16
	if cfg.HTTPS != nil {
		intercept = InterceptPort
	}
	h := &Host{
		cfg:    cfg,
		table:  table{name: "den_" + cfg.ID, pool: cfg.Pool.prefix, intercept: intercept},
		log:    cfg.Logger,
		slots:  map[int]string{},
		vms:    map[string]*attachment{},
		opened: map[string]map[netip.Addr]time.Time{},
	}
	if err := CheckPool(cfg.Pool, cfg.ID); err != nil {
		return nil, err
	}
	if on, err := enableForwarding(); err != nil {
		return nil, err
	} else if on {
		h.log.Info("den: turned on IPv4 forwarding for VM traffic (net.ipv4.ip_forward=1)")
	}
	var atts []attachment
	for _, v := range vms {
		a, _, err := h.register(v.Name, v.Lease, v.Policy)
		if err != nil {
			h.log.Warn("den: vm left off the network", "vm", v.Name, "err", err)
			continue
		}
		atts = append(atts, a)
	}
	// What the resolvers let through survives the remade table.
	carried := h.table.dnsAllowed(ctx)
	if err := h.table.run(ctx, h.table.base(atts)); err != nil {
		return nil, err
	}
	opts := egress.Options{Upstreams: cfg.DNSUpstreams, Allow: h.allow, Logger: cfg.Logger}
	if cfg.HTTPS != nil {
		opts.Intercept = cfg.HTTPS.Intercepts
	}
	h.res = egress.NewResolver(opts)
	var again strings.Builder // one transaction for them all
	for _, a := range atts {
		for addr, left := range carried[a.slot] {
			again.WriteString(h.table.allow(a.slot, []netip.Addr{addr}, left))
		}
	}
	if again.Len() > 0 {
		if err := h.table.run(ctx, again.String()); err != nil {
			h.log.Warn("den: addresses the resolvers let through before the restart", "err", err)
		}
	}
	for _, a := range atts {
		if err := h.up(a); err != nil {
			h.log.Warn("den: vm network", "vm", a.vm, "err", err)
		}
	}
	if err := h.prune(); err != nil {
		h.log.Warn("den: remove stale taps", "err", err)
	}
	return h, nil
}

// CheckPool refuses a pool that a route of the host overlaps (another
// network, or another den daemon's pool), other than routes on the TAPs
// of the daemon with this id.
func CheckPool(pool Pool, id string) error {
	pool = pool.orDefault()
	used, err := overlapping(pool.prefix, "dn"+id+"-")
	if err != nil {
		return err
	}
	if used != "" {
		return fmt.Errorf("network pool %s overlaps route %s (another network, or another den daemon's pool): choose another pool (--net-pool)", pool.prefix, used)
	}
	return nil
}

// validID: what a daemon id may be.
func validID(id string) bool {
	if id == "" || len(id) > 6 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// tapPrefix starts the names of this daemon's TAPs.
func (h *Host) tapPrefix() string { return "dn" + h.cfg.ID + "-" }

// register records a VM's lease and policy as the network's, and says
// whether they changed (its rules and resolver must then be made anew). A
// subnet outside the pool, or another VM's, is refused.
func (h *Host) register(vm string, l Lease, p egress.Policy) (attachment, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slot := h.cfg.Pool.Slot(l.Subnet)
	if slot < 0 || !l.Valid() {
		return attachment{}, false, fmt.Errorf("its subnet %s is not one of the pool %s", l.Subnet, h.cfg.Pool.prefix)
	}
	if other, ok := h.slots[slot]; ok && other != vm {
		return attachment{}, false, &SubnetTakenError{Subnet: l.Subnet, VM: other}
	}
	h.slots[slot] = vm
	if old, ok := h.vms[vm]; ok && old.lease == l && old.policy.String() == p.String() {
		return *old, false, nil
	}
	a := &attachment{vm: vm, slot: slot, lease: l, policy: p}
	h.vms[vm] = a
	delete(h.opened, vm) // the table's set is flushed with the new rules
	return *a, true, nil
}

// SubnetTakenError refuses a VM a subnet another VM holds here.
type SubnetTakenError struct {
	Subnet netip.Prefix
	VM     string // the VM that holds it
}

func (e *SubnetTakenError) Error() string {
	return fmt.Sprintf("its subnet %s is vm %q's", e.Subnet, e.VM)
}

// On reports whether vm is on this host's network (Attach put it there).
func (h *Host) On(vm string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.vms[vm]
	return ok
}

// Know marks l's subnet as held by vm, a VM this host does not run (in a
// cluster: one another host made): Reserve passes it by. A subnet held
// here already is left as it is.
func (h *Host) Know(vm string, l Lease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if slot := h.cfg.Pool.Slot(l.Subnet); slot >= 0 {
		if _, ok := h.slots[slot]; !ok {
			h.slots[slot] = vm
		}
	}
}

// Reserve takes a new lease for vm: the pool's lowest free subnet, or
// with anywhere one chosen at random among the free (two hosts of a
// cluster that chose the same then choose apart).
func (h *Host) Reserve(vm string, anywhere bool) (Lease, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	start := 0
	if anywhere {
		start = rand.IntN(h.cfg.Pool.Slots())
	}
	for i := 0; i < h.cfg.Pool.Slots(); i++ {
		n := (start + i) % h.cfg.Pool.Slots()
		if _, ok := h.slots[n]; ok {
			continue
		}
		h.slots[n] = vm
		return h.lease(n), nil
	}
	return Lease{}, fmt.Errorf("network pool %s is full (%d VMs): remove VMs or choose a larger pool", h.cfg.Pool.prefix, h.cfg.Pool.Slots())
}

// Attach puts a VM on the network (again): its TAP, its rules and its
// resolver, with policy p. It is idempotent; a VMM can then open the TAP.
// Rules and resolver are made anew only when lease or policy changed; the
// TAP is checked every time (a reboot takes TAPs away).
func (h *Host) Attach(ctx context.Context, vm string, l Lease, p egress.Policy) error {
	a, changed, err := h.register(vm, l, p)
	if err == nil && changed {
		err = h.table.run(ctx, h.table.vm(a, true))
		if err == nil {
			err = h.up(a)
		}
	} else if err == nil {
		err = ensureTap(a.lease, h.cfg.TapUID, h.cfg.TapGID)
	}
	if err != nil {
		return fmt.Errorf("attach vm %q: %w", vm, err)
	}
	return nil
}

// up makes the TAP of an attachment and starts its resolver.
func (h *Host) up(a attachment) error {
	if err := ensureTap(a.lease, h.cfg.TapUID, h.cfg.TapGID); err != nil {
		return err
	}
	if err := h.res.Serve(a.vm, netip.AddrPortFrom(a.lease.HostIP(), 53), a.policy); err != nil {
		return err
	}
	h.intercept(a)
	return nil
}

// intercept (re)starts a VM's HTTPS interceptor, if the host has one.
func (h *Host) intercept(a attachment) {
	if h.cfg.HTTPS == nil {
		return
	}
	vm := a.vm
	resolve := func(ctx context.Context, name string) ([]netip.Addr, error) {
		addrs, err := h.res.Resolve(ctx, vm, name)
		if err != nil {
			return nil, err
		}
		addrs = h.forVMs(addrs)
		if len(addrs) == 0 {
			return nil, fmt.Errorf("resolve %s for vm %s: only addresses of this host or its VMs", name, vm)
		}
		return addrs, nil
	}
	if err := h.cfg.HTTPS.Serve(vm, netip.AddrPortFrom(a.lease.HostIP(), InterceptPort), a.lease.GuestIP(), resolve); err != nil {
		// The VM works on; its HTTPS secrets do not.
		h.log.Warn("den: no https interceptor for the vm", "vm", vm, "err", err)
	}
}

// forVMs are the addresses den may connect to for a VM: none of the
// host's own (read once), of the VMs' pool, loopback, link-local,
// multicast or unspecified (the firewall keeps VMs from them; den's own
// connections do not pass it).
func (h *Host) forVMs(addrs []netip.Addr) []netip.Addr {
	local, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(addrs, func(a netip.Addr) bool {
		a = a.Unmap()
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() || h.cfg.Pool.prefix.Contains(a) {
			return true
		}
		return slices.ContainsFunc(local, func(ia net.Addr) bool {
			p, ok := ia.(*net.IPNet)
			if !ok {
				return false
			}
			ip, _ := netip.AddrFromSlice(p.IP)
			return ip.Unmap() == a
		})
	})
}

// SetPolicy changes a VM's egress policy at once, on a running VM too:
// its rules are replaced in one transaction, its resolver answers by the
// new policy, and its open connections are cut so that they meet the new
// rules.
func (h *Host) SetPolicy(ctx context.Context, vm string, p egress.Policy) error {
	h.mu.Lock()
	old, ok := h.vms[vm]
	h.mu.Unlock()
	if !ok {
		return fmt.Errorf("set egress policy of vm %q: it is not on the network", vm)
	}
	mu := h.policyLock(old.slot)
	mu.Lock()
	defer mu.Unlock()
	a, changed, err := h.register(vm, old.lease, p)
	if err == nil && !changed {
		return nil // the same policy: its rules and what it opened stay
	}
	if err == nil {
		err = h.table.run(ctx, h.table.vm(a, true))
	}
	if err != nil {
		return fmt.Errorf("set egress policy of vm %q: %w", vm, err)
	}
	h.res.SetPolicy(vm, p)
	h.intercept(a) // its connections out are cut too
	f := &netlink.ConntrackFilter{}
	if err := f.AddIP(netlink.ConntrackOrigSrcIP, net.IP(a.lease.GuestIP().AsSlice())); err == nil {
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			h.log.Debug("den: cut connections after a policy change", "vm", vm, "err", err)
		}
	}
	return nil
}

// Detach takes a VM off the network (it is removed): its rules, its
// resolver and its TAP go, and its subnet is free again. A VM that only
// reserved a lease frees it. It goes by name: an operation rolling back
// what it took uses Release, which cannot touch another VM's network.
func (h *Host) Detach(ctx context.Context, vm string) error {
	h.mu.Lock()
	slot, l := -1, Lease{}
	if a, ok := h.vms[vm]; ok {
		slot, l = a.slot, a.lease
	} else {
		for n, owner := range h.slots {
			if owner == vm {
				slot, l = n, h.lease(n)
			}
		}
	}
	h.mu.Unlock()
	if slot < 0 {
		return nil
	}
	return h.takeDown(ctx, vm, slot, l, true)
}

// Release gives back one lease that Reserve handed out for vm (the
// operation that took it is rolling back): its subnet is free again and,
// if vm is on the network with that lease, its rules, resolver and TAP
// go. Nothing else is touched: not vm's attachment on another lease (a
// VM of that name that existed already), not a subnet held by another
// VM, not a lease given back already.
func (h *Host) Release(ctx context.Context, vm string, l Lease) error {
	h.mu.Lock()
	slot := h.cfg.Pool.Slot(l.Subnet)
	if slot < 0 || h.slots[slot] != vm || h.lease(slot) != l {
		h.mu.Unlock()
		return nil
	}
	a, attached := h.vms[vm]
	attached = attached && a.lease == l
	h.mu.Unlock()
	return h.takeDown(ctx, vm, slot, l, attached)
}

// takeDown frees slot, held by vm on lease l, and with all removes the
// slot's rules, vm's resolver and the lease's TAP.
func (h *Host) takeDown(ctx context.Context, vm string, slot int, l Lease, all bool) error {
	var errs []error
	if all {
		h.res.Stop(vm)
		if h.cfg.HTTPS != nil {
			h.cfg.HTTPS.Stop(vm)
		}
		if err := h.table.run(ctx, h.table.remove(slot, l.Tap)); err != nil {
			errs = append(errs, err)
		}
		if err := removeTap(l.Tap); err != nil {
			errs = append(errs, err)
		}
	}
	h.mu.Lock()
	if a, ok := h.vms[vm]; ok && a.lease == l {
		delete(h.vms, vm)
		delete(h.opened, vm)
	}
	if h.slots[slot] == vm {
		delete(h.slots, slot)
	}
	h.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach vm %q: %w", vm, err)
	}
	return nil
}

// lease is the lease of pool slot n.
func (h *Host) lease(n int) Lease {
	return Lease{Subnet: h.cfg.Pool.Subnet(n), Tap: fmt.Sprintf("%s%d", h.tapPrefix(), n)}
}

// prune removes this daemon's TAPs that no VM owns (left by a VM removed
// while the daemon was killed).
func (h *Host) prune() error {
	names, err := taps(h.tapPrefix())
	if err != nil {
		return err
	}
	h.mu.Lock()
	owned := map[string]bool{}
	for _, a := range h.vms {
		owned[a.lease.Tap] = true
	}
	h.mu.Unlock()
	var errs []error
	for _, n := range names {
		if owned[n] {
			continue
		}
		h.log.Info("den: removing a tap no vm owns", "tap", n)
		errs = append(errs, removeTap(n))
	}
	return errors.Join(errs...)
}

// allow is the resolver's hook: a VM whose policy is p may reach addrs
// for ttl. Addresses the table lets through for more than half of ttl
// yet are left as they are; nothing opens once the VM's policy is
// another.
func (h *Host) allow(vm string, p egress.Policy, addrs []netip.Addr, ttl time.Duration) {
	now := time.Now()
	h.mu.Lock()
	a, ok := h.vms[vm]
	var need []netip.Addr
	for _, ad := range addrs {
		if h.opened[vm][ad].Sub(now) < ttl/2 {
			need = append(need, ad)
		}
	}
	h.mu.Unlock()
	if !ok || len(need) == 0 {
		return
	}
	mu := h.policyLock(a.slot)
	mu.Lock()
	defer mu.Unlock()
	h.mu.Lock()
	current := h.vms[vm] == a
	h.mu.Unlock()
	if !current || a.policy.String() != p.String() {
		return // detached, or its policy changed since the answer
	}
	s := h.table.allow(a.slot, need, ttl)
	if s == "" {
		return
	}
	if err := h.table.run(context.Background(), s); err != nil {
		h.log.Warn("den: let resolved addresses through", "vm", vm, "err", err)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.vms[vm] != a { // detached or given a new policy meanwhile
		return
	}
	if h.opened[vm] == nil {
		h.opened[vm] = map[netip.Addr]time.Time{}
	}
	for _, ad := range need {
		h.opened[vm][ad] = now.Add(ttl)
	}
}

// policyLock is the lock that orders slot's policy changes and openings.
func (h *Host) policyLock(slot int) *sync.Mutex { return &h.policyMu[slot%len(h.policyMu)] }

// Status is what den net log shows of a VM.
type Status struct {
	IP     string `json:"ip"`
	Tap    string `json:"tap"`
	Policy string `json:"policy"`
	// DeniedPackets counts the packets from the VM that were dropped:
	// refused by its egress policy, addressed to another VM, to the host
	// beyond its resolver and ping, or from an address not its own.
	// Denied lists their destinations, most refused first (kept an hour
	// after the last).
	DeniedPackets uint64   `json:"denied_packets"`
	Denied        []Denied `json:"denied,omitempty"`
	// DNS: queries answered and refused, and the last names refused.
	DNSQueries   uint64   `json:"dns_queries"`
	DNSRefused   uint64   `json:"dns_refused"`
	RefusedNames []string `json:"refused_names,omitempty"`
}

// NameOf is the name whose answer from den's resolver last gave vm the
// address a, "" if it remembers none.
func (h *Host) NameOf(vm string, a netip.Addr) string { return h.res.NameOf(vm, a) }

// Status reads a VM's network counters.
func (h *Host) Status(ctx context.Context, vm string) (Status, error) {
	h.mu.Lock()
	a, ok := h.vms[vm]
	h.mu.Unlock()
	if !ok {
		return Status{}, fmt.Errorf("vm %q is not on the network", vm)
	}
	st := Status{IP: a.lease.GuestIP().String(), Tap: a.lease.Tap, Policy: a.policy.String()}
	var err error
	st.DeniedPackets, st.Denied, err = h.table.denied(ctx, a.slot)
	ds := h.res.Stats(vm)
	st.DNSQueries, st.DNSRefused, st.RefusedNames = ds.Queries, ds.Refused, ds.LastRefused
	return st, err
}

// Close stops the resolvers. Devices and rules stay: VMs run on while the
// daemon is down, and the next start takes them over.
func (h *Host) Close() {
	if h.res != nil {
		h.res.Close()
	}
}

// String describes the host network for den info and doctor.
func (h *Host) String() string {
	return fmt.Sprintf("tap per vm, routed /%d subnets from %s, nat through nftables table inet %s", SubnetBits, h.cfg.Pool.prefix, h.table.name)
}
