package cloudhypervisor

// The subset of Cloud Hypervisor's REST API (vmm/src/api/openapi/
// cloud-hypervisor.yaml) that den uses. Fields den never sets or reads are
// left out: Cloud Hypervisor fills in its defaults, and a decoded VmInfo
// simply drops them. Restore keeps a snapshot's config.json as generic JSON
// for the same reason (see restore.go).

// VmConfig is the body of vm.create and the config in VmInfo.
type VmConfig struct {
	Cpus    *CpusConfig    `json:"cpus,omitempty"`
	Memory  *MemoryConfig  `json:"memory,omitempty"`
	Payload PayloadConfig  `json:"payload"`
	Disks   []DiskConfig   `json:"disks,omitempty"`
	Net     []NetConfig    `json:"net,omitempty"`
	Serial  *ConsoleConfig `json:"serial,omitempty"`
	Console *ConsoleConfig `json:"console,omitempty"`
	Vsock   *VsockConfig   `json:"vsock,omitempty"`
	// LandlockEnable restricts the VMM, once the VM is made, to the
	// paths of its config (disks, kernel, sockets, serial file) and
	// LandlockRules: the API's form of --landlock and --landlock-rules.
	LandlockEnable bool             `json:"landlock_enable,omitempty"`
	LandlockRules  []LandlockConfig `json:"landlock_rules,omitempty"`
}

// LandlockConfig lets the VMM at a path beyond its config's: Access
// "r", "w" or "rw" (--landlock-rules path=P,access=A).
type LandlockConfig struct {
	Path   string `json:"path"`
	Access string `json:"access"`
}

// CpusConfig sizes the vCPUs. Nested is sent explicitly: Cloud
// Hypervisor's default is true, den does not want nested virtualization.
type CpusConfig struct {
	BootVcpus int  `json:"boot_vcpus"`
	MaxVcpus  int  `json:"max_vcpus"`
	Nested    bool `json:"nested"`
}

// MemoryConfig sizes guest RAM. den sets Shared (a shared mapping, needed
// for snapshots and OnDemand restore) and turns hugepages off.
type MemoryConfig struct {
	Size      int64 `json:"size"`
	Shared    bool  `json:"shared"`
	Hugepages bool  `json:"hugepages"`
}

// PayloadConfig is what the VM boots.
type PayloadConfig struct {
	Kernel    string `json:"kernel,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
}

// DiskConfig is a virtio-blk device.
type DiskConfig struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly,omitempty"`
	ID       string `json:"id,omitempty"`
}

// NetConfig is a virtio-net device on a TAP.
type NetConfig struct {
	Tap string `json:"tap,omitempty"`
	MAC string `json:"mac,omitempty"`
	ID  string `json:"id,omitempty"`
}

// ConsoleMode is how a serial port or console is backed.
type ConsoleMode string

const (
	ConsoleOff  ConsoleMode = "Off"
	ConsoleFile ConsoleMode = "File"
	ConsoleNull ConsoleMode = "Null"
)

// ConsoleConfig is a serial port or virtio console.
type ConsoleConfig struct {
	Mode ConsoleMode `json:"mode"`
	File string      `json:"file,omitempty"`
}

// VsockConfig is the hybrid vsock device: guest ports are reached through
// the unix socket Socket on the host.
type VsockConfig struct {
	CID    uint32 `json:"cid"`
	Socket string `json:"socket"`
	ID     string `json:"id,omitempty"`
}

// VmInfo is the answer to vm.info. State is one of Created, Running,
// Paused, Shutdown, BreakPoint; den's vmm.State uses the same words.
type VmInfo struct {
	Config           VmConfig `json:"config"`
	State            string   `json:"state"`
	MemoryActualSize int64    `json:"memory_actual_size,omitempty"`
}

// VmmPingResponse is the answer to vmm.ping. BuildVersion is the release
// ("v53.0"); Version is the API's crate version.
type VmmPingResponse struct {
	BuildVersion string   `json:"build_version,omitempty"`
	Version      string   `json:"version"`
	PID          int64    `json:"pid,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// VmSnapshotConfig is the body of vm.snapshot.
type VmSnapshotConfig struct {
	DestinationURL string `json:"destination_url"`
}

// MemoryRestoreMode says how vm.restore brings memory back.
type MemoryRestoreMode string

const (
	// RestoreCopy reads the whole memory snapshot before the VM runs.
	RestoreCopy MemoryRestoreMode = "Copy"
	// RestoreOnDemand maps it lazily through userfaultfd: the snapshot's
	// memory-ranges file is read as pages fault in, for the VM's life.
	RestoreOnDemand MemoryRestoreMode = "OnDemand"
)

// RestoreConfig is the body of vm.restore. Prefault cannot be combined
// with OnDemand (Cloud Hypervisor answers 400).
type RestoreConfig struct {
	SourceURL         string            `json:"source_url"`
	MemoryRestoreMode MemoryRestoreMode `json:"memory_restore_mode,omitempty"`
	Resume            bool              `json:"resume"`
	Prefault          bool              `json:"prefault,omitempty"`
}

// VmResizeDisk is the body of vm.resize-disk: the disk's id (as in
// DiskConfig) and its new size in bytes.
type VmResizeDisk struct {
	ID          string `json:"id"`
	DesiredSize int64  `json:"desired_size"`
}

// VmCounters is the answer to vm.counters: per device, per counter. The
// values are unsigned: unset latency minimums read 2^64-1.
type VmCounters map[string]map[string]uint64
