package machine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/denhq/den/image"
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

// Driver is what den needs to know of one VMM: how to make and adopt the
// Hypervisor of a VM, and the few things that differ between VMMs (the
// kernel form it boots, how its guests reach the network). Everything
// else goes through vmm.Hypervisor and its Capabilities; nothing in den
// branches on a VMM's name.
type Driver struct {
	// Name is recorded with each VM ("qemu", "cloud-hypervisor").
	Name string
	// New returns the Hypervisor of a VM in its runtime dir.
	New func(rd vmm.RunDir) vmm.Hypervisor
	// Adopt re-attaches to a VM's running VMM.
	Adopt func(ctx context.Context, rd vmm.RunDir) (vmm.Hypervisor, error)
	// Kernel picks the kernel form the VMM boots from the image dir.
	Kernel func(image.Dir) string
	// Accel is the accelerator its guests run under ("kvm", "tcg").
	Accel string
	// UserNet: without TAP networking, guests get the VMM's user-mode
	// network (one net device without a TAP; network.UserNet is what the
	// guest is told of it).
	UserNet bool
	// Network says, for den info and doctor, how guests reach the
	// network without TAP networking.
	Network string
	// RAMFile: the VMM keeps guest RAM in a file in the VM's runtime
	// dir, which must have room for it.
	RAMFile bool
	// LazyRestore: a restore maps the snapshot's memory and faults it in
	// as the guest runs, rather than reading it all first (verification
	// then samples it before and reads the rest after).
	LazyRestore bool
	// StageMemory, when set, makes a RAM file and starts filling it with
	// a snapshot's memory ahead of the restore that takes it
	// (vmm.RestoreOptions.StagedMemory; qemu.StageMemory says how): the
	// snapshot's host dir, a local copy of its memory or "", the RAM file
	// to make; it returns the wait for the copy.
	StageMemory func(dir, local, dst string) (wait func() error, err error)
	// Prelaunch, when set, returns a VMM of VM vm to be prelaunched for a
	// restore in runtime dir rd, beside the VM's running one (its cgroup
	// is rd's name; its RAM file, once restored, the VM's).
	Prelaunch func(rd vmm.RunDir, vm string) vmm.Prelauncher
}

// builtinDrivers are the drivers of the VMMs found on this host.
func (m *Manager) builtinDrivers() map[string]Driver {
	ds := map[string]Driver{}
	if _, err := qemu.FindBinary(); err == nil {
		opts := func(rd vmm.RunDir) qemu.Options {
			return qemu.Options{RunDir: rd, Accel: m.kvm.Accelerator(), Logger: m.log, StreamRAM: m.cfg.QEMUStreamRAM,
				RAMFile: m.ramFile(filepath.Base(rd.Path())), Confine: m.vmmConfine(filepath.Base(rd.Path()))}
		}
		ds[VMMQEMU] = Driver{
			Name:   VMMQEMU,
			New:    func(rd vmm.RunDir) vmm.Hypervisor { return qemu.New(opts(rd)) },
			Adopt:  func(ctx context.Context, rd vmm.RunDir) (vmm.Hypervisor, error) { return qemu.Adopt(ctx, opts(rd)) },
			Kernel: func(d image.Dir) string { return d.BzImage() },
			Accel:  m.kvm.Accelerator(),
			// QEMU's user-mode network: the guest is 10.0.2.15 behind NAT.
			UserNet:     true,
			Network:     "qemu user-mode networking (outbound NAT only, no inbound)",
			RAMFile:     true,
			StageMemory: qemu.StageMemory,
			Prelaunch: func(rd vmm.RunDir, vm string) vmm.Prelauncher {
				o := opts(rd)
				o.RAMFile = m.ramFile(vm)
				return qemu.New(o)
			},
		}
	}
	if bin, err := cloudhypervisor.FindBinary(); err == nil {
		opts := func(rd vmm.RunDir) cloudhypervisor.Options {
			name := filepath.Base(rd.Path())
			return cloudhypervisor.Options{Binary: bin, RunDir: rd, Logger: m.log, Confine: m.vmmConfine(name),
				Landlock: true, LandlockRules: m.landlockRules(name)}
		}
		ds[VMMCloudHypervisor] = Driver{
			Name: VMMCloudHypervisor,
			New:  func(rd vmm.RunDir) vmm.Hypervisor { return cloudhypervisor.New(opts(rd)) },
			Adopt: func(ctx context.Context, rd vmm.RunDir) (vmm.Hypervisor, error) {
				return cloudhypervisor.Adopt(ctx, opts(rd))
			},
			Kernel:      func(d image.Dir) string { return d.Vmlinux() },
			Accel:       "kvm",
			Network:     "none (Cloud Hypervisor has no user-mode network)",
			LazyRestore: true,
		}
	}
	return ds
}

// landlockRules are the paths beyond its config a VM's Cloud
// Hypervisor may use: the VM's directory on the volume (its checkpoints
// and suspend snapshots), or, for a base image's throwaway VM, the
// volume's images.
func (m *Manager) landlockRules(name string) []cloudhypervisor.LandlockConfig {
	dir := storage.VMDir(name)
	if strings.HasPrefix(name, baseVMPrefix) {
		dir = storage.ImageDir("x").Dir() // the images root
	}
	p, err := m.vol.Path(dir)
	if err != nil {
		return nil
	}
	return []cloudhypervisor.LandlockConfig{{Path: p, Access: "rw"}}
}

// chooseVMM picks the driver new VMs run under: the one Config.VMM names,
// else Cloud Hypervisor where KVM boots guests, else QEMU.
func (m *Manager) chooseVMM() error {
	if m.cfg.Drivers != nil {
		m.drivers = m.cfg.Drivers
	} else {
		m.drivers = m.builtinDrivers()
	}
	want := m.cfg.VMM
	if want == "" {
		want = VMMQEMU
		if _, ok := m.drivers[VMMCloudHypervisor]; ok && m.kvm.Usable {
			want = VMMCloudHypervisor
		}
	}
	d, ok := m.drivers[want]
	if !ok {
		switch want {
		case VMMCloudHypervisor:
			return errors.New("vmm cloud-hypervisor asked for, but no binary found (DEN_CH_BINARY, PATH)")
		case VMMQEMU:
			_, err := qemu.FindBinary()
			return err
		}
		return fmt.Errorf("unknown vmm %q: use qemu or cloud-hypervisor", want)
	}
	m.vmmName = d.Name
	if d.Name == VMMQEMU && !m.kvm.Usable {
		m.log.Warn("den: VMs run under QEMU with TCG emulation (slow): " + m.kvm.Reason)
	}
	return nil
}

// driver is the driver of a VM's VMM.
func (m *Manager) driver(name string) (Driver, error) {
	d, ok := m.drivers[name]
	if !ok {
		return Driver{}, fmt.Errorf("vmm %q is not available on this host", name)
	}
	return d, nil
}

// newHypervisor returns the Hypervisor of a VM's VMM in its runtime dir.
func (m *Manager) newHypervisor(vmmName string, rd vmm.RunDir) (vmm.Hypervisor, error) {
	d, err := m.driver(vmmName)
	if err != nil {
		return nil, err
	}
	return d.New(rd), nil
}

// VMMName is the VMM new VMs run under.
func (m *Manager) VMMName() string { return m.vmmName }

// Accel is "kvm" or "tcg" for new VMs; the note says why.
func (m *Manager) Accel() (string, string) {
	return m.drivers[m.vmmName].Accel, m.kvm.Reason
}
