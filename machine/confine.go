package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/cgroup"
	"github.com/denhq/den/network"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// Confined VMMs: each VMM runs as an unprivileged user (Config.VMUser,
// den-vm by default, made when missing) in a cgroup of its own, made
// when the VMM starts and removed when it ends (discardRuntime). The
// user gets the VM's run dir and RAM file; QEMU gets its disks and
// snapshot streams as fds, so it opens no VM file by path. Only the
// built-in drivers are confined (test drivers start no process).

// DefaultPidsMax bounds a VMM's processes and threads: QEMU under TCG
// runs a thread per vCPU, an I/O thread, RCU and call threads, and up to
// 64 block I/O workers; Cloud Hypervisor a thread per vCPU and device.
const DefaultPidsMax = 256

// DefaultIOWeight is each VMM's share of block I/O (cgroup v2's default).
const DefaultIOWeight = 100

// confinement is the Manager's VMM confinement.
type confinement struct {
	user *vmm.User        // nil: VMMs run as root (no such user could be made)
	cgs  cgroup.Hierarchy // nil: no cgroups
	why  string           // what is missing, for den doctor

	mu     sync.Mutex
	groups map[string]cgroup.Group // by VM (runtime) name
}

// setupConfine finds or makes the VMM user and the host's cgroups;
// either missing is a warning. A state dir the VMM user cannot reach is
// an error: every VM would fail to start.
func (m *Manager) setupConfine() error {
	m.conf = &confinement{groups: map[string]cgroup.Group{}}
	if m.cfg.Drivers != nil || m.cfg.VMUser == "-" {
		m.conf.why = "confinement off (test drivers or VMUser \"-\")"
		return nil
	}
	name := m.cfg.VMUser
	if name == "" {
		name = vmm.DefaultUser
	}
	var whys []string
	u, made, err := vmm.EnsureUser(name)
	switch {
	case err != nil:
		m.log.Warn("den: VMMs run as root: their user could not be made", "user", name, "err", err)
		whys = append(whys, "VMMs run as root: "+err.Error())
	case made:
		m.log.Info("den: made the user VMMs run as", "user", name, "uid", u.UID)
	}
	m.conf.user = u
	h, err := cgroup.Detect()
	if err != nil {
		m.log.Warn("den: VMMs run without cgroups of their own", "err", err)
		whys = append(whys, err.Error())
	}
	m.conf.cgs = h
	if u != nil {
		if err := m.openPaths(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := network.GuardVMMUser(ctx, u.UID); err != nil {
			m.log.Warn("den: guests under QEMU's user-mode network can reach host services on loopback", "err", err)
			whys = append(whys, err.Error())
		}
	}
	m.conf.why = strings.Join(whys, "; ")
	return nil
}

// VMMGuard reports whether the VMM user's packets to the host's own
// addresses (but DNS) are dropped (network.GuardVMMUser), for den
// doctor; the error says why not.
func (m *Manager) VMMGuard(ctx context.Context) (bool, error) {
	if m.conf.user == nil {
		return false, errors.New("vmms run as root: no vmm user to guard against")
	}
	return network.VMMGuarded(ctx, m.conf.user.UID)
}

// openPaths lets the VMM user through (search, not list) the
// directories above its run dirs and RAM files, and keeps the state
// database from it.
func (m *Manager) openPaths() error {
	run := filepath.Dir(m.state.Run("x").Path())
	for _, d := range []string{m.state.Path(), run, m.ramDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			m.log.Warn("den: vmm user: directory", "dir", d, "err", err)
			continue
		}
		if err := os.Chmod(d, 0o711); err != nil {
			m.log.Warn("den: vmm user: directory", "dir", d, "err", err)
		}
	}
	if err := passThrough(m.state, m.conf.user.Name); err != nil {
		return err
	}
	for _, f := range []string{m.state.DB(), m.state.DB() + "-wal", m.state.DB() + "-shm"} {
		if err := os.Chmod(f, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("den: state database mode", "err", err)
		}
	}
	return nil
}

// CheckVMUserReach makes the check of New that can refuse a start for
// confinement, for a daemon to make before it mounts anything: the VMM
// user (vmUser, as Config.VMUser) must pass through every directory
// above the state dir. It makes the user when missing, as New would;
// "-", or a user that cannot be made (VMMs then run as root, as New
// warns), passes.
func CheckVMUserReach(state StateDir, vmUser string, log *slog.Logger) error {
	if vmUser == "-" {
		return nil
	}
	if vmUser == "" {
		vmUser = vmm.DefaultUser
	}
	u, made, err := vmm.EnsureUser(vmUser)
	if err != nil {
		return nil
	}
	if made {
		log.Info("den: made the user VMMs run as", "user", u.Name, "uid", u.UID)
	}
	return passThrough(state, u.Name)
}

// passThrough refuses a state dir that user cannot reach: a directory
// above it without search permission for others.
func passThrough(state StateDir, user string) error {
	for d := filepath.Dir(state.Path()); ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("state dir %s: VMMs run as %s, which cannot pass through %s (mode %04o): chmod o+x %s, choose another --state-dir, or --vmm-user - (VMMs as root)",
				state.Path(), user, d, st.Mode().Perm(), d)
		}
		if d == "/" || d == "." {
			break
		}
	}
	return nil
}

// vmmConfine is how the VMM of a VM (by runtime name) is confined: the
// user, and the group made for it by startConfine, if any.
func (m *Manager) vmmConfine(name string) vmm.Confine {
	c := vmm.Confine{User: m.conf.user}
	m.conf.mu.Lock()
	if g, ok := m.conf.groups[name]; ok {
		c.Cgroup = g
	}
	m.conf.mu.Unlock()
	return c
}

// DefaultCgroupOverhead is the memory a VMM's cgroup allows beside its
// guest's RAM. A cgroup counts more than the VMM's RSS (what
// DefaultVMMOverhead, the budget's figure, measures): the page cache of
// the VMM's I/O and its kernel memory too. It is about twice what a guest
// filling its RAM took under TCG (docs/benchmarks.md, "Constants set from
// measurements"), which leaves room for guests that run more varied code
// (TCG's translation cache grows with it); at less, the kernel killed
// QEMU rather than the guest's own allocator.
const DefaultCgroupOverhead = 256 << 20

// vmmLimits are the cgroup limits of a VM's VMM: its guest RAM plus
// DefaultCgroupOverhead (or the budget's VMM overhead, if set larger)
// and, under TCG, its translation cache; its vCPUs' worth of CPU,
// DefaultPidsMax, DefaultIOWeight.
func (m *Manager) vmmLimits(cpus int, memory int64) cgroup.Limits {
	overhead := max(m.adm.overhead, DefaultCgroupOverhead)
	if m.kvm.Accelerator() == "tcg" {
		overhead += qemu.TCGCacheMiB << 20
	}
	return cgroup.Limits{MemoryMax: memory + overhead, CPUQuota: float64(cpus),
		PidsMax: DefaultPidsMax, IOWeight: DefaultIOWeight}
}

// startConfine makes the cgroup a VM's VMM starts in (runtime name, its
// sizes); without cgroups it does nothing.
func (m *Manager) startConfine(name string, cpus int, memory int64) error {
	if m.conf.cgs == nil {
		return nil
	}
	m.dropCgroup(name) // a group a crashed VMM left
	g, err := m.conf.cgs.Create(m.cgroupName(name), m.vmmLimits(cpus, memory))
	if err != nil {
		return err
	}
	m.conf.mu.Lock()
	m.conf.groups[name] = g
	m.conf.mu.Unlock()
	return nil
}

// moveCgroup moves the processes of runtime name from's cgroup into
// to's (a prelaunched VMM taking its VM's) and removes from's.
func (m *Manager) moveCgroup(from, to string) {
	if m.conf == nil || m.conf.cgs == nil {
		return
	}
	m.conf.mu.Lock()
	src, okS := m.conf.groups[from]
	dst, okD := m.conf.groups[to]
	m.conf.mu.Unlock()
	if okS && okD {
		pids, err := src.Pids()
		for i := 0; err == nil && i < len(pids); i++ {
			err = dst.Add(pids[i])
		}
		if err != nil {
			m.log.Warn("den: move a vmm into its vm's cgroup", "from", from, "to", to, "err", err)
		}
	}
	m.dropCgroup(from)
}

// dropCgroup removes a VM's cgroup once its VMM is gone (bounded: the
// last threads of a killed VMM take a moment to leave).
func (m *Manager) dropCgroup(name string) {
	if m.conf == nil || m.conf.cgs == nil {
		return
	}
	m.conf.mu.Lock()
	g, ok := m.conf.groups[name]
	delete(m.conf.groups, name)
	m.conf.mu.Unlock()
	if !ok {
		g = m.conf.cgs.Open(m.cgroupName(name))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		m.log.Warn("den: remove vmm cgroup", "vm", name, "err", err)
	}
}

// cgroupName is the cgroup of a VM's VMM: the VM's name after this
// daemon's id (the network's), so that two daemons' VMs of one name
// have groups of their own.
func (m *Manager) cgroupName(name string) string { return m.netID() + "-" + name }

// CgroupStatus is a running VM's cgroup: its limits and what it uses.
type CgroupStatus struct {
	Name    string        `json:"name"`
	Version int           `json:"version"`
	Limits  cgroup.Limits `json:"limits"`
	Use     cgroup.Stats  `json:"use"`
}

// cgroupStatus reads a VM's cgroup; nil without one.
func (m *Manager) cgroupStatus(name string) *CgroupStatus {
	if m.conf == nil || m.conf.cgs == nil {
		return nil
	}
	g := m.conf.cgs.Open(m.cgroupName(name))
	l, err := g.Limits()
	if err != nil {
		return nil
	}
	s, err := g.Stats()
	if err != nil {
		return nil
	}
	return &CgroupStatus{Name: g.Name(), Version: g.Version(), Limits: l, Use: s}
}

// Confinement says how VMMs are confined here, for den doctor: the
// user they run as ("" when root), the cgroup version (0: none) and
// what is missing.
func (m *Manager) Confinement() (user string, cgroupVersion int, missing string) {
	if m.conf.user != nil {
		user = m.conf.user.Name
	}
	if m.conf.cgs != nil {
		cgroupVersion = m.conf.cgs.Version()
	}
	return user, cgroupVersion, m.conf.why
}
