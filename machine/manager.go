// Package machine owns each VM's life: one owner at a time per VM (its
// lock) takes it through the state table, over its record in the
// registry, its VMM, its disk on the volume and its guest agent.
//
// An operation is an op (op.go): begun under the VM's lock with its
// record and spec, it undoes what it took through one stack and commits
// through one method. The operations, one file each: create.go, fork.go
// and bringup.go (a new VM), session.go (a session's start or wake of
// its VM), sleep.go, wake.go, restore.go, checkpoint.go, vms.go (rm,
// reads), disk.go (resize); vmmrestore.go is the restore of a VMM from a
// snapshot that wake, restore, create and fork share.
//
// Manager holds the parts, each a type with one role: locks (owner.go),
// procs (running VMMs: instance.go, reconcile.go), startup (what the last
// daemon left: reconcile.go), vmms (the drivers: drivers.go), launcher
// (VMM config and cold boot: boot.go), bases (images and warm bases:
// base.go), snapshots (suspend slots, checkpoint files, staged memory and
// disks, local memory copies: suspend.go, memcopy.go, stage_ram.go,
// delta.go), integrity (digests: integrity.go), volumeGuard (volume loss
// and space: volume.go, space.go), disks (disk.go), memoryBudget
// (admission.go, pressure.go), agents (agentconn.go, identity.go),
// activity (last activity: activity.go), records (activity records:
// record.go), hostLife (the host's shutdown and boot:
// hostlife.go); and vmNet (network.go), spares (spares.go), confinement
// (confine.go) and guestRAM (ram.go), which need nothing of the Manager.
package machine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/agent"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// Config configures a Manager.
type Config struct {
	// State is den's local state directory.
	State StateDir
	// HostName names this host in what it records (the host a snapshot
	// was taken on); empty: the machine's hostname.
	HostName string
	// Leases are the cluster's VM leases, taken for this host (nil: a
	// host of its own, which takes none); see lease.go.
	Leases Leases
	// FetchMemory, in a cluster, asks another host for extents of its
	// local copy of a snapshot's memory (LocalMemory there), which a wake
	// here reads before the volume (peermemory.go); nil: never.
	FetchMemory func(ctx context.Context, host string, req MemoryRequest) (io.ReadCloser, error)
	// Volume holds VM disks, base images and snapshots.
	Volume storage.Volume
	// Images is the built guest image directory (kernel, initramfs,
	// root filesystems).
	Images image.Dir
	// DefaultImage is the root filesystem of VMs created without one.
	DefaultImage string
	// VMM forces a VMM ("qemu", "cloud-hypervisor", or a name from
	// Drivers); empty chooses:
	// Cloud Hypervisor when its binary is found and KVM boots guests,
	// else QEMU.
	VMM string
	// QEMUStreamRAM and RestoreCopy switch off, for comparison (den
	// bench), what makes snapshots and restores cheap: QEMU's
	// x-ignore-shared, Cloud Hypervisor's OnDemand memory.
	QEMUStreamRAM bool
	RestoreCopy   bool
	// MemoryFiles writes each snapshot's memory as a file of its own,
	// the layout before memory was stored by content (memkept.go), for
	// comparison (den bench).
	MemoryFiles bool
	// CollectGrace keeps the memory store's unreferenced packs younger
	// than this (0: memstore.DefaultGrace); see collect.go.
	CollectGrace time.Duration
	// BootTimeout bounds a boot until the agent answers (default 3 min:
	// TCG is slow).
	BootTimeout time.Duration
	// LockWait bounds waiting for a VM another operation holds
	// (default DefaultLockWait).
	LockWait time.Duration
	// DrainTimeout bounds how long Close waits for operations in flight
	// (default DefaultDrainTimeout).
	DrainTimeout time.Duration
	// VolumeWait bounds how long starting a VMM waits for a volume being
	// remounted (default DefaultVolumeWait).
	VolumeWait time.Duration
	// RAMDir holds the files that back guest RAM; empty: a tmpfs den
	// mounts at State.RAM().
	RAMDir string
	// MemoryCopies is how much of the state dir's disk local copies of
	// snapshots' memory may take (memcopy.go): 0 is
	// DefaultMemoryCopies, below 0 none are kept.
	MemoryCopies int64
	// NoDigests leaves snapshots without digests and restores without
	// verification (den bench measures what they cost).
	NoDigests bool
	// Registry is den's record; nil opens the SQLite one in State (and
	// Close closes it).
	Registry registry.Store
	// AgentKey is the private key file den reaches guest agents with
	// (made when missing); empty: the state dir's own (StateDir.HostKey).
	// The hosts of a cluster share one, on the volume.
	AgentKey string
	// Drivers replaces the VMM drivers found on the host (tests).
	Drivers map[string]vmm.Driver
	// Memory is the memory budget and the pressure watcher (see
	// admission.go, pressure.go).
	Memory MemoryConfig
	// BootWakeParallel is how many VMs put to sleep by a host shutdown
	// are woken at once when den starts (default
	// DefaultBootWakeParallel); see hostlife.go.
	BootWakeParallel int
	// MaxWakes bounds the VMs this host wakes, boots or restores at once
	// (default DefaultMaxWakes): after a cluster host is lost, a storm
	// of requests for its VMs waits its turn here, at most WakeWait,
	// then fails in one line.
	MaxWakes int
	WakeWait time.Duration
	// ActivitySave is how often a running VM's last activity is written
	// to the registry, at most (default DefaultActivitySave); see
	// activity.go.
	ActivitySave time.Duration
	// RecordPull is how often a running VM's guest process record is read
	// into its activity record (default DefaultRecordPull; below 0: only
	// before operations and reads); RecordCap bounds a VM's record
	// (default activity.DefaultCap). See record.go.
	RecordPull time.Duration
	RecordCap  int64
	// OnAgent, when set, hears of every new connection to a VM's guest
	// agent (after a boot, a wake, a restore, a redial), with a function
	// that writes an entry to the VM's activity record; it must not
	// block (the daemon serves den's SSH secrets on it).
	OnAgent func(vm string, c *agent.Client, note func(activity.Entry))
	// Network is how VMs reach the network (network.go).
	Network NetworkConfig
	// VMUser is the unprivileged user VMMs run as (made when missing);
	// empty: vmm.DefaultUser (den-vm); "-": VMMs run as root, in no
	// cgroup of their own (confine.go).
	VMUser string
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
}

// DefaultMaxWakes and DefaultWakeWait: see Config.MaxWakes.
const (
	DefaultMaxWakes = 8
	DefaultWakeWait = 2 * time.Minute
)

// DefaultMemoryCopies is the disk local copies of snapshots' memory may
// take by default.
const DefaultMemoryCopies = 4 << 30

// DefaultDrainTimeout bounds Close's wait for operations in flight.
const DefaultDrainTimeout = 5 * time.Minute

// Defaults for a VM created without sizes.
const (
	DefaultCPUs        = 1
	DefaultMemory      = 512 << 20
	DefaultDisk        = 4 << 30
	DefaultIdleTimeout = 10 * time.Minute
	MinMemory          = 128 << 20
)

// Manager runs den's VMs.
type Manager struct {
	cfg    Config
	state  StateDir
	db     registry.Store
	ownDB  bool // the Manager opened db and closes it
	vol    storage.Volume
	signer ssh.Signer
	log    *slog.Logger

	kvm     vmm.KVMStatus
	here    thisHost // what snapshots taken here record (compat.go)
	drivers map[string]vmm.Driver
	vmmName string // the driver new VMs run under

	imageMu sync.Mutex // serialises base image imports

	adm *admission // the memory budget (admission.go)

	net vmNet // the VMs' TAP networking, if any (network.go)

	ram guestRAM // where guest RAM files go (ram.go)

	conf *confinement // the VMMs' user and cgroups (confine.go)

	usage usageCache // the disks' last measured use (usage.go)

	seal       sealer         // digests snapshots' large files
	background sync.WaitGroup // digests and verifications under way

	// The Manager's roles, each a type of its own (see the package doc);
	// wire gives them their way back to it.
	locks     locks
	procs     procs
	startup   startup
	vmms      vmms
	launch    launcher
	bases     bases
	boot      bootFiles
	compat    compat
	diffs     diffs
	snaps     snapshots
	integrity integrity
	guard     volumeGuard
	disks     disks
	budget    memoryBudget
	agents    agents
	activity  lastActivity
	records   records
	host      hostLife
	gc        collector
	sched     schedules
	leases    *vmLeases

	mu        sync.Mutex
	instances map[string]*instance
	holders   map[string]holder        // VMs an operation holds the lock of
	waiters   map[string]chan struct{} // closed when a holder lets go
	ops       sync.WaitGroup           // operations holding a VM's lock
	closed    chan struct{}
	closeOnce sync.Once // Close's work, once closed is closed
	// digestsEnd ends the digests of snapshots (endDigests): with closed
	// on a host of its own, once they are written (or Close's bound is
	// over) on a cluster host.
	digestsEnd  chan struct{}
	digestsOnce sync.Once
	hostWG      sync.WaitGroup // the boot wake (hostlife.go)
	actWG       sync.WaitGroup // the activity saver (activity.go)
	hostDown    atomic.Bool    // a host shutdown began: no new work is admitted (hostlife.go)

	// lastRelease is when an operation last let go of a VM (waitQuiet);
	// under mu.
	lastRelease time.Time

	// wakes holds a slot per wake, boot or restore under way (MaxWakes).
	wakes chan struct{}

	// volumeLostAt is when the volume's mount was last lost, and why:
	// VMMs started before then run on a dead disk.
	volumeLostAt  time.Time
	volumeLostWhy string
}

// New opens the state database, chooses the VMM, and re-adopts the VMs
// that were running (a daemon restart does not stop them); VMs whose VMM
// died meanwhile are marked stopped with the reason, half-created ones are
// rolled back.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 3 * time.Minute
	}
	if cfg.DefaultImage == "" {
		cfg.DefaultImage = image.Debian
	}
	if cfg.MaxWakes <= 0 {
		cfg.MaxWakes = DefaultMaxWakes
	}
	if cfg.WakeWait <= 0 {
		cfg.WakeWait = DefaultWakeWait
	}
	if err := os.MkdirAll(cfg.State.Path(), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	db, ownDB := cfg.Registry, false
	if db == nil {
		sq, err := registry.Open(cfg.State.DB())
		if err != nil {
			return nil, err
		}
		db, ownDB = sq, true
	}
	closeDB := func() {
		if ownDB {
			db.Close()
		}
	}
	keyPath := cfg.AgentKey
	if keyPath == "" {
		keyPath = cfg.State.HostKey()
	}
	signer, err := agent.LoadOrCreateHostKey(keyPath)
	if err != nil {
		closeDB()
		return nil, err
	}
	m := &Manager{
		cfg: cfg, state: cfg.State, db: db, ownDB: ownDB, vol: cfg.Volume, signer: signer, log: cfg.Logger,
		kvm: vmm.DetectKVM(), here: newThisHost(cfg.HostName), instances: map[string]*instance{}, holders: map[string]holder{}, waiters: map[string]chan struct{}{},
		closed: make(chan struct{}), digestsEnd: make(chan struct{}), wakes: make(chan struct{}, cfg.MaxWakes),
	}
	wire(m)
	m.usage = usageCache{db: db, vol: cfg.Volume, log: m.log, background: m.inBackground}
	m.adm = m.budget.newAdmission()
	m.snaps.spares = &spares{vol: cfg.Volume, log: m.log, background: m.inBackground}
	if err := m.vmms.chooseVMM(); err != nil {
		closeDB()
		return nil, err
	}
	m.ram.setup(cfg.RAMDir, m.state, m.drivers, m.log)
	budget := cfg.MemoryCopies
	if budget == 0 {
		budget = DefaultMemoryCopies
	}
	endStep := phase.Begin(ctx, StartStep+"local files")
	if err := m.snaps.initMemCopies(budget); err != nil {
		closeDB()
		return nil, fmt.Errorf("local memory copies: %w", err)
	}
	m.snaps.spares.dropAll(ctx) // one may be half made
	m.diffs.sweep()
	endStep()
	if m.conf, err = newConfinement(m.cfg, m.ram.dir, m.adm.overhead, m.kvm.Accelerator()); err != nil {
		closeDB()
		return nil, err
	}
	endStep = phase.Begin(ctx, StartStep+"network")
	err = m.setupNetwork(ctx)
	endStep()
	if err != nil {
		closeDB()
		return nil, err
	}
	if err := m.startup.reconcile(ctx); err != nil {
		closeDB()
		return nil, err
	}
	_ = os.Remove(m.state.UsageFile()) // an earlier den's figures: the registry keeps them now
	go m.guard.watchVolume()
	go m.budget.watchPressure()
	m.activity.startActivitySaver()
	m.records.startPuller()
	m.gc.start()
	m.sched.start()
	if cfg.Leases != nil {
		go m.leases.watchLapsed()
	}
	m.inBackground(func(ctx context.Context) { m.usage.warm(ctx, m.db) })
	// VMs a host shutdown put to sleep wake in the background.
	m.host.startBootWake()
	return m, nil
}

// Close refuses new operations, lets those in flight finish or roll back
// (for at most Config.DrainTimeout), then closes agent connections and
// the database. Running VMs keep running: a new Manager adopts them.
func (m *Manager) Close() error {
	first := false
	m.closeOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	// A host shutdown (SleepAll) may have closed it already.
	m.host.refuseNew()
	if m.cfg.Leases == nil {
		m.leases.endDigests() // the next start writes them
	}
	drained := make(chan struct{})
	go func() { m.ops.Wait(); m.hostWG.Wait(); close(drained) }()
	wait := m.cfg.DrainTimeout
	if wait <= 0 {
		wait = DefaultDrainTimeout
	}
	deadline := time.Now().Add(wait)
	select {
	case <-drained:
	case <-time.After(wait):
		m.log.Warn("den: operations still running at shutdown; closing anyway", "waited", wait)
	}
	// A cluster host keeps a VM's lease until the digests of its sleep
	// are written, and another host takes over, as a lost host's, a VM
	// whose lease this one let lapse: so it lets the digests under way
	// finish first, within what is left of the bound, and gives those
	// leases back.
	if m.seal.any() && m.cfg.Leases != nil {
		m.log.Info("den: stopping once the digests of snapshots under way are written", "within", time.Until(deadline).Round(time.Second))
		if !poll.Until(time.Until(deadline), func() bool { return !m.seal.any() }) {
			m.log.Warn("den: digests still being written at shutdown: their vms' leases stay held until the next start writes them")
		}
	}
	m.leases.endDigests()
	// Background digests end at their next extent: wait for them, so
	// that none reads a volume being unmounted.
	bg := make(chan struct{})
	go func() { m.background.Wait(); m.ram.frees.wait(); m.leases.afterDigest.Wait(); close(bg) }()
	select {
	case <-bg:
	case <-time.After(30 * time.Second):
		m.log.Warn("den: background digests still running at shutdown")
	}
	// The instances stay known (Running still counts them): their VMMs
	// run on, and the next Manager adopts them.
	m.mu.Lock()
	insts := make([]*instance, 0, len(m.instances))
	for _, in := range m.instances {
		insts = append(insts, in)
	}
	m.mu.Unlock()
	for _, in := range insts {
		in.closeAgent()
	}
	m.activity.stopActivitySaver() // and the last activity written, for the next daemon
	m.records.wg.Wait()
	if m.net.host != nil {
		m.net.host.Close() // the resolvers; TAPs and rules stay with the VMs
	}
	if m.ownDB {
		return m.db.Close()
	}
	return nil
}

// wire gives the Manager's parts, each a role of its own, their way back
// to it.
func wire(m *Manager) *Manager {
	m.integrity = integrity{m}
	m.host = hostLife{m}
	m.bases = bases{m}
	m.boot = bootFiles{m: m}
	m.compat = compat{m}
	m.diffs = diffs{m}
	m.launch = launcher{m}
	m.vmms = vmms{m}
	m.snaps = snapshots{m: m, removals: make(chan struct{}, 2)}
	m.startup = startup{m}
	m.guard = volumeGuard{m}
	m.disks = disks{m}
	m.budget = memoryBudget{m}
	m.locks = locks{m}
	m.procs = procs{m}
	m.agents = agents{m}
	m.activity = lastActivity{m}
	m.records = records{m: m}
	m.gc = collector{m: m}
	m.sched = schedules{m: m}
	m.leases = &vmLeases{m: m, refs: map[string]int{}, held: map[string]registry.Lease{}, failed: map[string]bool{}}
	return m
}
