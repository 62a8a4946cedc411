package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/hostinfo"
	"github.com/denhq/den/storage"
)

// HostFile is the file beside a VMM's snapshot (in the snapshot's
// directory) that says where it was taken: the host, its VMM and its
// CPU. A restore reads it first and refuses a host the snapshot cannot
// run on, before anything changes.
const HostFile = "host.json"

// snapshotHost is where a memory snapshot was taken.
type snapshotHost struct {
	Host       string `json:"host"`
	VMM        string `json:"vmm"`
	VMMVersion string `json:"vmm_version,omitempty"`
	// SnapshotVersion is the part of VMMVersion a restoring VMM must
	// share (vmm.Capabilities).
	SnapshotVersion string `json:"snapshot_version,omitempty"`
	Accel           string `json:"accel"`
	CPUVendor       string `json:"cpu_vendor,omitempty"`
	CPUModel        string `json:"cpu_model,omitempty"`
	// CPUFlags are the host CPU's features: under KVM the guest sees
	// them, and its kernel and programs use those it found.
	CPUFlags []string `json:"cpu_flags,omitempty"`
}

// compat records, with every memory snapshot, the host it was taken on,
// and checks a snapshot's record before it is restored here.
type compat struct{ m *Manager }

// thisHost is what this host records of itself in snapshots, and
// compares with theirs (once per Manager: neither the CPU nor the VMM
// binaries change under a running daemon).
type thisHost struct {
	name string
	cpu  hostinfo.CPUInfo
}

func newThisHost(name string) thisHost {
	if name == "" {
		name, _ = os.Hostname()
	}
	return thisHost{name: name, cpu: hostinfo.ReadCPU()}
}

// record is this host as a snapshot of a VM under vmmName records it.
func (c compat) record(vmmName string) snapshotHost {
	m := c.m
	caps := m.vmms.caps(vmmName)
	return snapshotHost{
		Host: m.here.name, VMM: vmmName, VMMVersion: caps.Version, SnapshotVersion: caps.SnapshotVersion,
		Accel: caps.Accelerator, CPUVendor: m.here.cpu.Vendor, CPUModel: m.here.cpu.Model, CPUFlags: m.here.cpu.Flags,
	}
}

// write puts this host's record into the snapshot directory
// dir (a host path) of a VM under vmmName. Not synced: the snapshot's
// writer syncs the directory once, then digests its small files, this
// one with them.
func (c compat) write(dir, vmmName string) error {
	if err := atomicfile.ReplaceJSON(filepath.Join(dir, HostFile), c.record(vmmName), 0o640); err != nil {
		return fmt.Errorf("record the snapshot's host: %w", err)
	}
	return nil
}

// check refuses to restore the snapshot in dir (a volume path) on
// this host under vmmName when it was taken where this host cannot run
// it: another VMM, or one whose snapshots this one's cannot read, another
// accelerator, or under KVM another CPU vendor or a CPU with features
// this one lacks. A snapshot that records no host (taken before den
// recorded them) is let through. It returns the host that took it (""
// when none is recorded).
func (c compat) check(ctx context.Context, dir storage.Path, vmmName string) (string, error) {
	m := c.m
	from, err := c.read(dir)
	if err != nil || from == nil {
		return "", err
	}
	if err := from.restorableOn(c.record(vmmName)); err != nil {
		return "", fmt.Errorf("its memory cannot be restored on host %s: %w (bring it up on a host like %s, or restore a disk-only checkpoint): %w",
			m.here.name, err, from.Host, ErrConflict)
	}
	return from.Host, nil
}

// read is the host record of the snapshot in dir (a volume path); nil
// when it has none (taken before den recorded them).
func (c compat) read(dir storage.Path) (*snapshotHost, error) {
	host, err := c.m.vol.Path(dir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(host, HostFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the snapshot's host: %w", err)
	}
	var from snapshotHost
	if err := json.Unmarshal(data, &from); err != nil {
		return nil, fmt.Errorf("snapshot host record %s: %w", filepath.Join(host, HostFile), err)
	}
	return &from, nil
}

// linuxOnlyFlag are /proc/cpuinfo flags that Linux defines itself
// (mitigations it chose, its view of the TSC, its virtualization helpers)
// rather than CPUID bits a guest sees: they change with the host's
// kernel and boot parameters on the same hardware, so they decide
// nothing about a snapshot.
var linuxOnlyFlag = map[string]bool{
	"pti": true, "kaiser": true, "ibrs": true, "ibpb": true, "stibp": true, "ibrs_enhanced": true, "ssbd": true,
	"kernel_ibrs": true, "rsb_ctxsw": true, "rsb_vmexit": true, "retpoline": true, "retpoline_amd": true,
	"retpoline_lfence": true, "use_ibpb": true, "use_ibrs_fw": true, "l1tf_pteinv": true, "user_shstk": true,
	"constant_tsc": true, "nonstop_tsc": true, "nonstop_tsc_s3": true, "tsc_reliable": true, "tsc_known_freq": true,
	"art": true, "arch_perfmon": true, "rep_good": true, "nopl": true, "xtopology": true, "cpuid": true,
	"aperfmperf": true, "cpuid_fault": true, "epb": true, "amd_dcm": true, "extd_apicid": true, "rapl": true,
	"tpr_shadow": true, "flexpriority": true, "ept": true, "vpid": true, "ept_ad": true, "vnmi": true,
	"vmmcall": true, "xenpv": true, "hw_pstate": true, "proc_feedback": true, "cpb": true, "zen": true,
}

// compatKey is what of h a snapshot taken there needs of the host that
// restores it: hosts with one key restore each other's snapshots.
func (h snapshotHost) compatKey() string {
	k := h.VMM + " " + h.SnapshotVersion + " " + h.Accel
	if h.Accel == "kvm" {
		k += " " + h.CPUVendor
		for _, f := range h.CPUFlags {
			if !linuxOnlyFlag[f] {
				k += " " + f
			}
		}
	}
	return k
}

// maxFlagsNamed bounds the CPU features an error names.
const maxFlagsNamed = 6

// restorableOn says why a snapshot taken at o cannot be restored at
// here (another host's record, or this one's); nil when it can.
func (o snapshotHost) restorableOn(here snapshotHost) error {
	switch {
	case o.VMM != here.VMM:
		return fmt.Errorf("it was taken by %s on host %s, and host %s restores it with %s", o.VMM, o.Host, here.Host, here.VMM)
	case o.SnapshotVersion != "" && here.SnapshotVersion != "" && o.SnapshotVersion != here.SnapshotVersion:
		return fmt.Errorf("it was taken by %s %s on host %s, and %s %s on host %s does not read that version's snapshots",
			o.VMM, o.VMMVersion, o.Host, here.VMM, here.VMMVersion, here.Host)
	case o.Accel != here.Accel:
		return fmt.Errorf("it was taken under %s on host %s, and host %s runs VMs under %s", o.Accel, o.Host, here.Host, here.Accel)
	case o.Accel != "kvm":
		return nil // an emulated CPU is the VMM's, whatever the host's
	case o.CPUVendor != "" && here.CPUVendor != "" && o.CPUVendor != here.CPUVendor:
		return fmt.Errorf("it was taken on a %s CPU (host %s), and host %s's is %s", o.CPUVendor, o.Host, here.Host, here.CPUVendor)
	}
	var missing []string
	for _, f := range o.CPUFlags {
		if linuxOnlyFlag[f] {
			continue
		}
		if _, ok := slices.BinarySearch(here.CPUFlags, f); !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	named := strings.Join(missing[:min(len(missing), maxFlagsNamed)], " ")
	if len(missing) > maxFlagsNamed {
		named += fmt.Sprintf(" and %d more", len(missing)-maxFlagsNamed)
	}
	return fmt.Errorf("host %s's CPU (%s) has features host %s's (%s) lacks, which the guest may use: %s", o.Host, o.CPUModel, here.Host, here.CPUModel, named)
}
