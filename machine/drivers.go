package machine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/denhq/den/fence"
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

// builtinDrivers are the drivers of the VMMs found on this host, by
// name; what each VMM does is in its Capabilities and the optional
// interfaces of vmm.Driver, and nothing here branches on its name.
func (vs *vmms) builtinDrivers() map[string]vmm.Driver {
	ds := map[string]vmm.Driver{}
	// Versions are asked once: snapshots record them, and restores
	// compare (compat.go).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if bin, err := qemu.FindBinary(); err == nil {
		ver, err := qemu.Version(ctx, bin)
		if err != nil {
			vs.m.log.Warn("den: qemu version unknown: its snapshots are restored without a version check", "err", err)
		}
		ds[VMMQEMU] = &qemu.Driver{
			Accel: vs.m.kvm.Accelerator(), Version: ver,
			Options: func(rd vmm.RunDir, vm string) qemu.Options {
				return qemu.Options{RunDir: rd, Logger: vs.m.log, StreamRAM: vs.m.cfg.QEMUStreamRAM,
					RAMFile: vs.m.ram.file(vm), Confine: vs.m.conf.vmm(rd.Name())}
			},
		}
	}
	if bin, err := cloudhypervisor.FindBinary(); err == nil {
		ver, err := cloudhypervisor.Version(ctx, bin)
		if err != nil {
			vs.m.log.Warn("den: cloud-hypervisor version unknown: its snapshots are restored without a version check", "err", err)
		}
		ds[VMMCloudHypervisor] = &cloudhypervisor.Driver{
			Version: ver,
			Options: func(rd vmm.RunDir) cloudhypervisor.Options {
				return cloudhypervisor.Options{Binary: bin, RunDir: rd, Logger: vs.m.log, Confine: vs.m.conf.vmm(rd.Name()),
					Landlock: true, LandlockRules: vs.landlockRules(rd.Name())}
			},
		}
	}
	return ds
}

// landlockRules are the paths beyond its config a VM's Cloud
// Hypervisor may use: the VM's directory on the volume (its checkpoints
// and suspend snapshots), or, for a base image's throwaway VM, the
// volume's images.
func (vs *vmms) landlockRules(name string) []cloudhypervisor.LandlockConfig {
	dir := storage.VMDir(name)
	if strings.HasPrefix(name, baseVMPrefix) {
		dir = storage.ImageDir("x").Dir() // the images root
	}
	p, err := vs.m.vol.Path(dir)
	if err != nil {
		return nil
	}
	return []cloudhypervisor.LandlockConfig{{Path: p, Access: "rw"}}
}

// chooseVMM picks the driver new VMs run under: the one Config.VMM names,
// else Cloud Hypervisor where KVM boots guests, else QEMU.
func (vs *vmms) chooseVMM() error {
	if vs.m.cfg.Drivers != nil {
		vs.m.drivers = vs.m.cfg.Drivers
	} else {
		vs.m.drivers = vs.builtinDrivers()
	}
	want := vs.m.cfg.VMM
	if want == "" {
		want = VMMQEMU
		if _, ok := vs.m.drivers[VMMCloudHypervisor]; ok && vs.m.kvm.Usable {
			want = VMMCloudHypervisor
		}
	}
	d, ok := vs.m.drivers[want]
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
	vs.m.vmmName = d.Capabilities().Name
	if vs.m.vmmName == VMMQEMU && !vs.m.kvm.Usable {
		vs.m.log.Warn("den: VMs run under QEMU with TCG emulation (slow): " + vs.m.kvm.Reason)
	}
	return nil
}

// driver is the driver of a VM's VMM.
func (vs *vmms) driver(name string) (vmm.Driver, error) {
	d, ok := vs.m.drivers[name]
	if !ok {
		return nil, fmt.Errorf("vmm %q is not available on this host", name)
	}
	return d, nil
}

// caps are the capabilities of a VM's VMM; none when it is not
// available here.
func (vs *vmms) caps(name string) vmm.Capabilities {
	if d, ok := vs.m.drivers[name]; ok {
		return d.Capabilities()
	}
	return vmm.Capabilities{}
}

// newHypervisor returns the Hypervisor of a VM's VMM in its runtime
// dir, for a VMM to start (mayStart).
func (vs *vmms) newHypervisor(vmmName string, rd vmm.RunDir) (vmm.Hypervisor, error) {
	if err := vs.mayStart(); err != nil {
		return nil, err
	}
	d, err := vs.driver(vmmName)
	if err != nil {
		return nil, err
	}
	return d.New(rd), nil
}

// mayStart refuses to start a VMM once this host's fence deadline has
// passed: a cluster host whose lease is lost (package fence) starts
// none, even for an operation in flight when it was lost. The fence
// guard kills one that starts as the deadline passes, within its tick.
func (vs *vmms) mayStart() error {
	passed, ok, err := fence.Passed(vs.m.state.Fence())
	if err != nil {
		return fmt.Errorf("read this host's fence deadline: %w", err)
	}
	if ok && passed {
		return fmt.Errorf("this host's fence deadline (%s) has passed: it lost its host lease, and starts no VMM: %w", vs.m.state.Fence(), ErrConflict)
	}
	return nil
}

// vmms are the VMM drivers found on the host and the one new VMs run under
// (drivers.go).
type vmms struct{ m *Manager }
