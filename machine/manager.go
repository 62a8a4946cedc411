// Package machine ties den's parts into VMs: the registry's records, a VMM
// per VM, disks on the storage volume and the guest agent connection, with
// one lock per VM, rollback of half-done work, and every state read checked
// against the running processes.
package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/image"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/cloudhypervisor"
	"github.com/denhq/den/vmm/qemu"
)

// VMM names recorded per VM.
const (
	VMMQEMU            = "qemu"
	VMMCloudHypervisor = "cloud-hypervisor"
)

// Config configures a Manager.
type Config struct {
	// State is den's local state directory.
	State StateDir
	// Volume holds VM disks, base images and snapshots.
	Volume storage.Volume
	// Images is the built guest image directory (kernel, initramfs,
	// root filesystems).
	Images image.Dir
	// DefaultImage is the root filesystem of VMs created without one.
	DefaultImage string
	// VMM forces a VMM ("qemu", "cloud-hypervisor"); empty chooses:
	// Cloud Hypervisor when its binary is found and KVM boots guests,
	// else QEMU.
	VMM string
	// QEMUStreamRAM and RestoreCopy switch off, for comparison (den
	// bench), what makes snapshots and restores cheap: QEMU's
	// x-ignore-shared, Cloud Hypervisor's OnDemand memory.
	QEMUStreamRAM bool
	RestoreCopy   bool
	// BootTimeout bounds a boot until the agent answers (default 3 min:
	// TCG is slow).
	BootTimeout time.Duration
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
}

// Defaults for a VM created without sizes.
const (
	DefaultCPUs        = 1
	DefaultMemory      = 512 << 20
	DefaultDisk        = 4 << 30
	DefaultIdleTimeout = 10 * time.Minute
	MinMemory          = 128 << 20
	MaxCPUs            = 64
)

// Manager runs den's VMs.
type Manager struct {
	cfg    Config
	state  StateDir
	db     *registry.DB
	vol    storage.Volume
	signer ssh.Signer
	log    *slog.Logger

	kvm     vmm.KVMStatus
	vmmName string
	chBin   string

	imageMu sync.Mutex // serialises base image imports

	mu        sync.Mutex
	instances map[string]*instance
	busy      map[string]int // VMs an operation holds the lock of
	closed    chan struct{}
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
	if err := os.MkdirAll(cfg.State.Path(), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	db, err := registry.Open(cfg.State.DB())
	if err != nil {
		return nil, err
	}
	signer, err := agent.LoadOrCreateHostKey(cfg.State.HostKey())
	if err != nil {
		db.Close()
		return nil, err
	}
	m := &Manager{
		cfg: cfg, state: cfg.State, db: db, vol: cfg.Volume, signer: signer, log: cfg.Logger,
		kvm: vmm.DetectKVM(), instances: map[string]*instance{}, busy: map[string]int{}, closed: make(chan struct{}),
	}
	if err := m.chooseVMM(); err != nil {
		db.Close()
		return nil, err
	}
	if err := m.reconcile(ctx); err != nil {
		db.Close()
		return nil, err
	}
	go m.watchVolume()
	return m, nil
}

// chooseVMM picks Cloud Hypervisor where it can run guests, else QEMU.
func (m *Manager) chooseVMM() error {
	want := m.cfg.VMM
	if bin, err := cloudhypervisor.FindBinary(); err == nil {
		m.chBin = bin
	}
	switch want {
	case "":
		if m.chBin != "" && m.kvm.Usable {
			m.vmmName = VMMCloudHypervisor
		} else {
			m.vmmName = VMMQEMU
		}
	case VMMCloudHypervisor:
		if m.chBin == "" {
			return errors.New("vmm cloud-hypervisor asked for, but no binary found (DEN_CH_BINARY, PATH)")
		}
		m.vmmName = want
	case VMMQEMU:
		m.vmmName = want
	default:
		return fmt.Errorf("unknown vmm %q: use qemu or cloud-hypervisor", want)
	}
	if m.vmmName == VMMQEMU {
		if _, err := qemu.FindBinary(); err != nil {
			return err
		}
		if !m.kvm.Usable {
			m.log.Warn("den: VMs run under QEMU with TCG emulation (slow): " + m.kvm.Reason)
		}
	}
	return nil
}

// VMMName is the VMM new VMs run under; Accel its accelerator.
func (m *Manager) VMMName() string { return m.vmmName }

// Accel is "kvm" or "tcg"; AccelNote says why.
func (m *Manager) Accel() (string, string) {
	if m.vmmName == VMMCloudHypervisor {
		return "kvm", m.kvm.Reason
	}
	return m.kvm.Accelerator(), m.kvm.Reason
}

// Network says how VMs reach the network.
func (m *Manager) Network() string {
	if m.vmmName == VMMQEMU {
		return "qemu user-mode networking (outbound NAT only, no inbound)"
	}
	return "none (Cloud Hypervisor without TAP setup)"
}

// newHypervisor returns the driver for a VM's VMM in its runtime dir.
func (m *Manager) newHypervisor(vmmName string, rd vmm.RunDir) vmm.Hypervisor {
	if vmmName == VMMCloudHypervisor {
		return cloudhypervisor.New(cloudhypervisor.Options{Binary: m.chBin, RunDir: rd, Logger: m.log})
	}
	return qemu.New(qemu.Options{RunDir: rd, Accel: m.kvm.Accelerator(), Logger: m.log, StreamRAM: m.cfg.QEMUStreamRAM})
}

// adoptHypervisor re-attaches to a VM's running VMM.
func (m *Manager) adoptHypervisor(ctx context.Context, vmmName string, rd vmm.RunDir) (vmm.Hypervisor, error) {
	if vmmName == VMMCloudHypervisor {
		return cloudhypervisor.Adopt(ctx, cloudhypervisor.Options{Binary: m.chBin, RunDir: rd, Logger: m.log})
	}
	return qemu.Adopt(ctx, qemu.Options{RunDir: rd, Accel: m.kvm.Accelerator(), Logger: m.log, StreamRAM: m.cfg.QEMUStreamRAM})
}

// Close stops watching the VMs and closes agent connections and the
// database. Running VMs keep running: a new Manager adopts them.
func (m *Manager) Close() error {
	m.mu.Lock()
	select {
	case <-m.closed:
		m.mu.Unlock()
		return nil
	default:
	}
	close(m.closed)
	insts := m.instances
	m.instances = map[string]*instance{}
	m.mu.Unlock()
	for _, in := range insts {
		in.closeAgent()
	}
	return m.db.Close()
}

// instance is the live side of a VM that has a VMM process.
type instance struct {
	name     string
	hv       vmm.Hypervisor
	stopping chan struct{} // closed when den itself stops the VMM

	dialMu  sync.Mutex // serialises redials of the agent
	agentMu sync.Mutex
	agent   *agent.Client

	actMu    sync.Mutex
	sessions int
	lastAct  time.Time
}

func (in *instance) closeAgent() {
	in.agentMu.Lock()
	defer in.agentMu.Unlock()
	if in.agent != nil {
		in.agent.Close()
		in.agent = nil
	}
}

func (m *Manager) instance(name string) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.instances[name]
}

func (m *Manager) setInstance(in *instance) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.instances[in.name] = in
}

func (m *Manager) dropInstance(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.instances, name)
}
