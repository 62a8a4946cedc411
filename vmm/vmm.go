// Package vmm defines the one interface den uses to drive a virtual machine
// monitor process for one VM, whatever the VMM behind it.
//
// Drivers live in sub-packages (vmm/cloudhypervisor, vmm/qemu). Each VM gets
// one Hypervisor value, bound to one runtime directory; the VMM process it
// starts lives in its own session and outlives the caller, so that a daemon
// restart re-adopts running VMs instead of killing them.
package vmm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/denhq/den/internal/sparse"
)

// Hypervisor runs and controls the VMM process of one VM.
//
// The life of a VM:
//
//	Start -> Create -> Boot -> (Pause <-> Resume) -> Shutdown
//	Start -> Restore(dir) -> ...                     (a fresh VMM only)
//
// Snapshot needs a paused VM. Restore goes into a VMM that has no VM yet.
// Every method honours its context's deadline for the call, never for the
// life of the VMM process.
type Hypervisor interface {
	// Capabilities says what this driver and host can do.
	Capabilities() Capabilities
	// Start makes the VMM ready to take Create or Restore. A VMM whose
	// machine is fixed on its command line (QEMU) starts its process in
	// Create or Restore instead; Start then only checks that it can.
	Start(ctx context.Context) error
	// Create defines the VM from cfg without running it.
	Create(ctx context.Context, cfg Config) error
	// Boot runs a created VM.
	Boot(ctx context.Context) error
	// Pause stops the vCPUs; memory and devices stay.
	Pause(ctx context.Context) error
	// Resume runs the vCPUs of a paused VM.
	Resume(ctx context.Context) error
	// Snapshot writes the state of a paused VM (memory and devices) into
	// dir, which must exist and be empty. The VM stays paused. Its files
	// may not be synced: the caller syncs dir before it relies on them.
	Snapshot(ctx context.Context, dir string) error
	// Restore brings a VM back from a snapshot directory into this VMM,
	// which must not have a VM yet.
	Restore(ctx context.Context, dir string, opts RestoreOptions) error
	// ResizeDisk grows disk id (its Disk.ID; "" is the root disk, the
	// first) of a created VM, running or paused, to bytes (see
	// CheckDiskGrow): the VMM resizes the image file and the guest
	// kernel sees the new capacity (a virtio config change). Resizing to
	// the file's current size still tells the guest, for a file grown
	// behind the VMM's back (before a restore). The filesystem on the
	// disk is the guest's to grow (the agent's GrowRoot).
	ResizeDisk(ctx context.Context, id string, bytes int64) error
	// Info reports the VM's state as the VMM sees it.
	Info(ctx context.Context) (Info, error)
	// Shutdown stops the guest and the VMM process (SIGTERM, then SIGKILL)
	// and returns when the process is gone.
	Shutdown(ctx context.Context) error
	// Discard ends the VMM process at once (SIGKILL), without a clean
	// exit or a flush of its devices, and returns when it is gone: for a
	// VM whose running state and disk writes are thrown away (a restore
	// replaces both). A VMM it cannot kill so is shut down.
	Discard(ctx context.Context) error
	// DialGuest opens a stream to a port of the guest's agent over the
	// guest channel (vsock or virtio-serial).
	DialGuest(ctx context.Context, port uint32) (net.Conn, error)
	// Exited is closed when the VMM process has exited; ExitErr then says
	// how.
	Exited() <-chan struct{}
	ExitErr() error
	// PID is the VMM process id, 0 before it started.
	PID() int
}

// ChannelKind names how the host reaches the guest agent.
type ChannelKind string

const (
	// ChannelVsock is a virtio-vsock device: any number of connections,
	// one per guest port (Cloud Hypervisor's hybrid vsock).
	ChannelVsock ChannelKind = "vsock"
	// ChannelSerial is one virtio-serial port: a single stream, so the
	// host keeps one connection and multiplexes over it; the port
	// argument of DialGuest is ignored.
	ChannelSerial ChannelKind = "virtio-serial"
)

// DeltaSnapshotter is a Hypervisor whose memory snapshot can be written
// over an earlier one: a guest's memory changes little between two
// snapshots, and writing it whole is most of a sleep or a checkpoint.
type DeltaSnapshotter interface {
	// DeltaMemoryFile names the memory file of its snapshot directories;
	// "" when this VMM has none to write over (its RAM goes elsewhere).
	DeltaMemoryFile() string
	// SnapshotOver is Snapshot into dir where the file DeltaMemoryFile
	// names already holds an earlier snapshot's memory (a metadata
	// clone), of which base is a local copy: only the pages that differ
	// from base are written. When base cannot be read, the memory is
	// written whole.
	SnapshotOver(ctx context.Context, dir, base string) error
}

// MemoryKeeper is a Hypervisor whose guest RAM is a file on the host
// that the caller keeps itself: its snapshots then hold the devices'
// state only, the caller stores the memory as it likes (by content,
// package memstore) and fills the RAM file again on a restore
// (RestoreOptions.FillMemory).
type MemoryKeeper interface {
	// SnapshotDevices is Snapshot without the memory: the VM stays
	// paused, its memory in RAMFile, which the caller reads before it
	// resumes the VM.
	SnapshotDevices(ctx context.Context, dir string) error
	// RAMFile is the file the guest's RAM is in ("" when it is in none:
	// SnapshotDevices would not do).
	RAMFile() string
	// MemoryRanges are the data ranges of RAMFile that the
	// SnapshotDevices into dir found (and recorded there, in the VMM's
	// own layout): the caller stores those and need not look for the
	// RAM's holes again. An error when dir has none recorded.
	MemoryRanges(dir string) ([]sparse.Extent, error)
}

// Capabilities says what a driver can do on this host.
type Capabilities struct {
	// Name of the VMM ("cloud-hypervisor", "qemu").
	Name string
	// Version the binary reports.
	Version string
	// SnapshotVersion is the part of Version that the VMM taking a
	// snapshot and the one restoring it must share ("" when Version is
	// not known): QEMU keeps its migration format within a major.minor
	// release, Cloud Hypervisor promises nothing across releases.
	SnapshotVersion string
	// Accelerator in use ("kvm" or "tcg").
	Accelerator string
	// Pause and Resume are supported.
	Pause bool
	// Snapshot and Restore of memory and device state are supported.
	Snapshot bool
	// OnDemandRestore: restored memory faults in lazily, so restore cost
	// does not grow with RAM size.
	OnDemandRestore bool
	// GuestChannel is how DialGuest reaches the agent.
	GuestChannel ChannelKind
	// MultiConn: DialGuest may hold several connections at once.
	MultiConn bool
	// ResizeDisk: disks of a running or paused VM can grow.
	ResizeDisk bool
	// Kernel is the form of guest kernel the VMM boots.
	Kernel KernelForm
	// RAMFile: guest RAM lives in a file on the host (the driver's
	// Options say where), which must have room for it.
	RAMFile bool
	// UserNet: without a TAP, guests get the VMM's user-mode network
	// (one net device without a TAP).
	UserNet bool
	// Network says, for den info and doctor, how guests reach the
	// network without TAP networking.
	Network string
}

// KernelForm is a form of guest kernel.
type KernelForm string

// The kernel forms an image holds.
const (
	KernelBzImage KernelForm = "bzImage" // a compressed kernel with its setup code
	KernelVmlinux KernelForm = "vmlinux" // an uncompressed ELF kernel with a PVH entry
)

// Config describes a VM to create.
type Config struct {
	// CPUs is the number of vCPUs.
	CPUs int `json:"cpus"`
	// MemoryBytes is the guest RAM size.
	MemoryBytes int64 `json:"memory_bytes"`
	// Kernel is the path of the guest kernel (bzImage or PVH vmlinux, as
	// the driver needs).
	Kernel string `json:"kernel"`
	// Initramfs is the path of the initramfs, if any.
	Initramfs string `json:"initramfs,omitempty"`
	// Cmdline is the kernel command line.
	Cmdline string `json:"cmdline"`
	// Disks are attached in order: the first is the root disk (/dev/vda).
	Disks []Disk `json:"disks"`
	// Net is the network interfaces, if any.
	Net []Net `json:"net,omitempty"`
	// GuestCID is the vsock context id of the guest (3 if zero).
	GuestCID uint32 `json:"guest_cid,omitempty"`
}

// Disk is a block device backed by a raw image file.
type Disk struct {
	ID       string `json:"id"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readonly,omitempty"`
}

// Net is a network interface: a TAP device on the host, or, where the
// driver supports it and Tap is empty, user-mode networking.
type Net struct {
	ID  string `json:"id"`
	Tap string `json:"tap,omitempty"`
	MAC string `json:"mac,omitempty"`
}

// Validate checks a config for the mistakes every driver would reject.
func (c Config) Validate() error {
	if c.CPUs < 1 {
		return fmt.Errorf("config: cpus must be at least 1, got %d", c.CPUs)
	}
	if c.MemoryBytes < 64<<20 {
		return fmt.Errorf("config: memory must be at least 64 MiB, got %d bytes", c.MemoryBytes)
	}
	if c.Kernel == "" {
		return errors.New("config: no kernel given")
	}
	for _, d := range c.Disks {
		if d.Path == "" {
			return fmt.Errorf("config: disk %q has no path", d.ID)
		}
	}
	return nil
}

// FindDisk returns the disk named id ("" is the first, the root disk) and
// its index in c.Disks.
func (c Config) FindDisk(id string) (Disk, int, error) {
	if len(c.Disks) == 0 {
		return Disk{}, -1, fmt.Errorf("vm has no disks: %w", ErrNoSuchDisk)
	}
	if id == "" {
		return c.Disks[0], 0, nil
	}
	ids := make([]string, len(c.Disks))
	for i, d := range c.Disks {
		if d.ID == id {
			return d, i, nil
		}
		ids[i] = d.ID
	}
	return Disk{}, -1, fmt.Errorf("no disk %q (the vm has %q): %w", id, ids, ErrNoSuchDisk)
}

// CheckDiskGrow checks that the image file of d may be resized to
// bytes: a positive multiple of 512 (the guest counts sectors), no
// smaller than the file now (shrinking would cut off a filesystem that
// may already fill it), on a writable disk.
func CheckDiskGrow(d Disk, bytes int64) error {
	if bytes <= 0 || bytes%512 != 0 {
		return fmt.Errorf("size %d is not a positive multiple of 512 bytes", bytes)
	}
	if d.ReadOnly {
		return fmt.Errorf("disk %q is read-only", d.ID)
	}
	st, err := os.Stat(d.Path)
	if err != nil {
		return fmt.Errorf("disk %q: %w", d.ID, err)
	}
	if bytes < st.Size() {
		return fmt.Errorf("disk %q is %d bytes, refusing to shrink it to %d", d.ID, st.Size(), bytes)
	}
	return nil
}

// RestoreOptions tunes Restore.
type RestoreOptions struct {
	// Resume runs the VM at once; otherwise it comes back paused.
	Resume bool
	// OnDemand maps memory lazily where the driver can (Capabilities.OnDemandRestore);
	// otherwise memory is copied in before the VM runs.
	OnDemand bool
	// Config, when not nil, replaces the host paths the snapshot
	// recorded (disks, network, sockets) so that a snapshot can be
	// restored as another VM (a fork) or after its files moved. Its CPU
	// and memory sizes must match the snapshot.
	Config *Config
	// DisksReady, when set, is waited for before the VMM opens the VM's
	// disks: a disk still being cloned while the memory is read in. Its
	// error fails the restore before the guest runs.
	DisksReady func() error
	// LocalMemory, when set, is a byte-for-byte copy of the snapshot's
	// memory file on the host's own disk (the caller checked it matches):
	// a driver that copies memory in reads it there rather than through
	// the volume. Drivers that map the snapshot's memory ignore it.
	LocalMemory string
	// StagedMemory, when set, is a RAM file of the guest's size that the
	// caller is filling with the snapshot's memory (qemu.StageMemory), and
	// WaitStaged waits until it is whole: a driver that copies memory into
	// a RAM file takes this one instead (should WaitStaged fail, it makes
	// its copy in it). Drivers that map the snapshot's memory ignore it.
	StagedMemory string
	WaitStaged   func() error
	// FillMemory, when set, fills dst, a RAM file of the guest's size,
	// with the snapshot's memory: for a snapshot whose memory the caller
	// keeps (MemoryKeeper), when there is no LocalMemory to copy.
	FillMemory func(dst string) error
	// Verified, when set, is the caller's check of the snapshot, waited
	// for before the VMM loads the guest's device state from it: a driver
	// may start its VMM (with the Config's paths) and fill its RAM
	// meanwhile. Its error fails the restore before the guest runs.
	Verified func() error
}

// Prelauncher is a Hypervisor that can start its VMM process for a
// Restore ahead of it, while the VM's current VMM still runs: a restore
// then pays no process start once the old VMM is gone.
type Prelauncher interface {
	Hypervisor
	// Prelaunch starts the VMM process for a later Restore of a
	// snapshot with cfg's machine (the Restore's Config), in its own
	// runtime directory, without running anything.
	Prelaunch(ctx context.Context, cfg Config, p Prelaunch) error
	// MoveRunDir renames the VMM's runtime directory to rd, which must
	// not exist, and uses it from then on: the prelaunched VMM takes the
	// VM's own once the old one is gone.
	MoveRunDir(rd RunDir) error
}

// Prelaunch is what a prelaunched VMM is started with besides its
// config.
type Prelaunch struct {
	// Memory is the RAM file the Restore's StagedMemory will name.
	Memory string
	// DiskFiles, where set, is the file opened for each of the config's
	// disks in place of its Path: a staged copy the caller renames to
	// the disk's path before the Restore (the VMM keeps the file open).
	DiskFiles []string
	// Pred is the VM's running VMM, nil if none: the new VMM shares its
	// network devices (the same TAP) until it is gone.
	Pred Hypervisor
}

// WaitVerified waits for o.Verified, if set.
func (o RestoreOptions) WaitVerified() error {
	if o.Verified == nil {
		return nil
	}
	return o.Verified()
}

// WaitDisks waits for o.DisksReady, if any.
func (o RestoreOptions) WaitDisks() error {
	if o.DisksReady == nil {
		return nil
	}
	if err := o.DisksReady(); err != nil {
		return fmt.Errorf("disks: %w", err)
	}
	return nil
}

// State is a VM's state as its VMM reports it.
type State string

const (
	StateNotCreated State = "NotCreated"
	StateCreated    State = "Created"
	StateRunning    State = "Running"
	StatePaused     State = "Paused"
	StateShutdown   State = "Shutdown"
)

// transitions lists the states each VMM operation may start from.
var transitions = map[string][]State{
	"create":   {StateNotCreated},
	"boot":     {StateCreated},
	"pause":    {StateRunning},
	"resume":   {StatePaused},
	"snapshot": {StatePaused},
	"restore":  {StateNotCreated},
}

// CheckTransition reports whether op may run on a VM in state from; the
// error names both.
func CheckTransition(op string, from State) error {
	allowed, ok := transitions[op]
	if !ok {
		return fmt.Errorf("unknown vmm operation %q", op)
	}
	for _, s := range allowed {
		if s == from {
			return nil
		}
	}
	return fmt.Errorf("%s: vm is %s, want %v: %w", op, from, allowed, ErrInvalidState)
}

// Info is what the VMM reports about its VM.
type Info struct {
	State       State  `json:"state"`
	PID         int    `json:"pid"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	CPUs        int    `json:"cpus,omitempty"`
	Version     string `json:"version,omitempty"`
}

var (
	// ErrInvalidState is wrapped by errors for an operation the VM's
	// current state does not allow.
	ErrInvalidState = errors.New("invalid state for this operation")
	// ErrNotRunning is wrapped when the VMM process is not alive.
	ErrNotRunning = errors.New("vmm process is not running")
	// ErrNoSuchDisk is wrapped when a disk id names no disk of the VM.
	ErrNoSuchDisk = errors.New("no such disk")
	// ErrNoGuestListener is wrapped when the guest channel connected but
	// nothing in the guest answered on the port in time.
	ErrNoGuestListener = errors.New("no guest listener answered")
)

// DefaultCallTimeout bounds a VMM call whose context has no deadline.
const DefaultCallTimeout = 30 * time.Second

// WithDefaultTimeout returns ctx with DefaultCallTimeout applied when it
// has no deadline of its own.
func WithDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultCallTimeout)
}
