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

// confinement is the Manager's VMM confinement: the user VMMs run as
// and the cgroup each VMM runs in, by VM (runtime) name.
type confinement struct {
	user *vmm.User        // nil: VMMs run as root (no such user could be made)
	cgs  cgroup.Hierarchy // nil: no cgroups
	why  string           // what is missing, for den doctor
	// prefix names this daemon's groups (two daemons' VMs of one name
	// have groups of their own); overhead is what a VMM's group allows
	// beside its guest's RAM (limits).
	prefix   string
	overhead int64
	log      *slog.Logger

	mu     sync.Mutex
	groups map[string]cgroup.Group // by VM (runtime) name
}

// newConfinement finds or makes the VMM user (cfg.VMUser) and the
// host's cgroups; either missing is a warning. A state dir the VMM user
// cannot reach is an error: every VM would fail to start. ramDir is
// where guest RAM files go, overhead the memory budget's per-VMM
// overhead and accel the accelerator VMMs run under.
func newConfinement(cfg Config, ramDir string, overhead int64, accel string) (*confinement, error) {
	log := cfg.Logger
	overhead = max(overhead, DefaultCgroupOverhead)
	if accel == "tcg" {
		overhead += qemu.TCGCacheMiB << 20
	}
	c := &confinement{groups: map[string]cgroup.Group{}, prefix: netID(cfg.State), overhead: overhead, log: log}
	if cfg.Drivers != nil || cfg.VMUser == "-" {
		c.why = "confinement off (test drivers or VMUser \"-\")"
		return c, nil
	}
	name := cfg.VMUser
	if name == "" {
		name = vmm.DefaultUser
	}
	var whys []string
	u, made, err := vmm.EnsureUser(name)
	switch {
	case err != nil:
		log.Warn("den: VMMs run as root: their user could not be made", "user", name, "err", err)
		whys = append(whys, "VMMs run as root: "+err.Error())
	case made:
		log.Info("den: made the user VMMs run as", "user", name, "uid", u.UID)
	}
	c.user = u
	h, err := cgroup.Detect()
	if err != nil {
		log.Warn("den: VMMs run without cgroups of their own", "err", err)
		whys = append(whys, err.Error())
	}
	c.cgs = h
	if u != nil {
		if err := openPaths(cfg.State, ramDir, u, log); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := network.GuardVMMUser(ctx, u.UID); err != nil {
			log.Warn("den: guests under QEMU's user-mode network can reach host services on loopback", "err", err)
			whys = append(whys, err.Error())
		}
	}
	c.why = strings.Join(whys, "; ")
	return c, nil
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
// directories above its run dirs and RAM files (in ramDir), and keeps
// the state database from it.
func openPaths(state StateDir, ramDir string, user *vmm.User, log *slog.Logger) error {
	run := filepath.Dir(state.Run("x").Path())
	for _, d := range []string{state.Path(), run, ramDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			log.Warn("den: vmm user: directory", "dir", d, "err", err)
			continue
		}
		if err := os.Chmod(d, 0o711); err != nil {
			log.Warn("den: vmm user: directory", "dir", d, "err", err)
		}
	}
	if err := passThrough(state, user.Name); err != nil {
		return err
	}
	for _, f := range []string{state.DB(), state.DB() + "-wal", state.DB() + "-shm"} {
		if err := os.Chmod(f, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("den: state database mode", "err", err)
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

// vmm is how the VMM of a VM (by runtime name) is confined: the user,
// and the group made for it by start, if any.
func (c *confinement) vmm(name string) vmm.Confine {
	vc := vmm.Confine{User: c.user}
	c.mu.Lock()
	if g, ok := c.groups[name]; ok {
		vc.Cgroup = g
	}
	c.mu.Unlock()
	return vc
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

// limits are the cgroup limits of a VM's VMM: its guest RAM plus the
// overhead (DefaultCgroupOverhead, or the budget's VMM overhead if set
// larger, and under TCG its translation cache); its vCPUs' worth of CPU,
// DefaultPidsMax, DefaultIOWeight.
func (c *confinement) limits(cpus int, memory int64) cgroup.Limits {
	return cgroup.Limits{MemoryMax: memory + c.overhead, CPUQuota: float64(cpus),
		PidsMax: DefaultPidsMax, IOWeight: DefaultIOWeight}
}

// start makes the cgroup a VM's VMM starts in (runtime name, its sizes);
// without cgroups it does nothing.
func (c *confinement) start(name string, cpus int, memory int64) error {
	if c.cgs == nil {
		return nil
	}
	c.drop(name) // a group a crashed VMM left
	g, err := c.cgs.Create(c.groupName(name), c.limits(cpus, memory))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.groups[name] = g
	c.mu.Unlock()
	return nil
}

// move moves the processes of runtime name from's cgroup into to's (a
// prelaunched VMM taking its VM's) and removes from's.
func (c *confinement) move(from, to string) {
	if c == nil || c.cgs == nil {
		return
	}
	c.mu.Lock()
	src, okS := c.groups[from]
	dst, okD := c.groups[to]
	c.mu.Unlock()
	if okS && okD {
		pids, err := src.Pids()
		for i := 0; err == nil && i < len(pids); i++ {
			err = dst.Add(pids[i])
		}
		if err != nil {
			c.log.Warn("den: move a vmm into its vm's cgroup", "from", from, "to", to, "err", err)
		}
	}
	c.drop(from)
}

// drop removes a VM's cgroup once its VMM is gone (bounded: the last
// threads of a killed VMM take a moment to leave).
func (c *confinement) drop(name string) {
	if c == nil || c.cgs == nil {
		return
	}
	c.mu.Lock()
	g, ok := c.groups[name]
	delete(c.groups, name)
	c.mu.Unlock()
	if !ok {
		g = c.cgs.Open(c.groupName(name))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		c.log.Warn("den: remove vmm cgroup", "vm", name, "err", err)
	}
}

// groupName is the cgroup of a VM's VMM: the VM's name after this
// daemon's prefix.
func (c *confinement) groupName(name string) string { return c.prefix + "-" + name }

// CgroupStatus is a running VM's cgroup: its limits and what it uses.
type CgroupStatus struct {
	Name    string        `json:"name"`
	Version int           `json:"version"`
	Limits  cgroup.Limits `json:"limits"`
	Use     cgroup.Stats  `json:"use"`
}

// status reads a VM's cgroup; nil without one.
func (c *confinement) status(name string) *CgroupStatus {
	if c == nil || c.cgs == nil {
		return nil
	}
	g := c.cgs.Open(c.groupName(name))
	l, err := g.Limits()
	if err != nil {
		return nil
	}
	st, err := g.Stats()
	if err != nil {
		return nil
	}
	return &CgroupStatus{Name: g.Name(), Version: g.Version(), Limits: l, Use: st}
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
