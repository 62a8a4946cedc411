package cloudhypervisor

import (
	"fmt"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/vmm"
)

// defaultCID is the guest's vsock context id when the config names none.
const defaultCID = 3

// vsockID is the device id of the vsock device.
const vsockID = "vsock0"

// vmConfig maps den's VM config to Cloud Hypervisor's: the serial port
// writes to the run directory's console log, the virtio console is off,
// the hybrid vsock listens on the run directory's vsock socket, and memory
// is a shared mapping without hugepages (snapshots and OnDemand restore
// need it shared).
func (v *VMM) vmConfig(cfg vmm.Config) (VmConfig, error) {
	if err := cfg.Validate(); err != nil {
		return VmConfig{}, err
	}
	rd := v.opts.RunDir
	cid := cfg.GuestCID
	if cid == 0 {
		cid = defaultCID
	}
	if cid < 3 {
		return VmConfig{}, fmt.Errorf("config: guest cid %d is reserved, want 3 or more", cid)
	}
	out := VmConfig{
		Cpus:   &CpusConfig{BootVcpus: cfg.CPUs, MaxVcpus: cfg.CPUs},
		Memory: &MemoryConfig{Size: cfg.MemoryBytes, Shared: true},
		Payload: PayloadConfig{
			Kernel:    cfg.Kernel,
			Initramfs: cfg.Initramfs,
			Cmdline:   cfg.Cmdline,
		},
		Serial:  &ConsoleConfig{Mode: ConsoleFile, File: rd.ConsoleLog()},
		Console: &ConsoleConfig{Mode: ConsoleOff},
		Vsock:   &VsockConfig{CID: cid, Socket: rd.VsockSocket(), ID: vsockID},
	}
	for _, d := range cfg.Disks {
		out.Disks = append(out.Disks, DiskConfig{Path: d.Path, Readonly: d.ReadOnly, ID: d.ID})
	}
	for _, n := range cfg.Net {
		if n.Tap == "" {
			return VmConfig{}, fmt.Errorf("config: net %q has no tap: cloud-hypervisor has no user-mode networking", n.ID)
		}
		out.Net = append(out.Net, NetConfig{Tap: n.Tap, MAC: n.MAC, ID: n.ID})
	}
	out.LandlockEnable, out.LandlockRules = v.landlock()
	return out, nil
}

// landlock is the VM config's landlock setting: off unless
// Options.Landlock; on, the run dir (its sockets, logs, a restore's
// private dir) and Options.LandlockRules besides the config's own paths.
func (v *VMM) landlock() (bool, []LandlockConfig) {
	if !v.opts.Landlock {
		return false, nil
	}
	rules := []LandlockConfig{{Path: v.opts.RunDir.Path(), Access: "rw"}}
	return true, append(rules, v.opts.LandlockRules...)
}

// saveConfig records the config the VM was created or restored with in
// the run directory (vmm.RunDir.ConfigFile); failing to is only logged.
func (v *VMM) saveConfig(cfg vmm.Config) {
	if err := atomicfile.WriteJSON(v.opts.RunDir.ConfigFile(), cfg, 0o640); err != nil {
		v.log.Warn("could not record the vm config", "err", err)
	}
}
