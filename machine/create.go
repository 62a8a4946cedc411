package machine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/network"
	"github.com/denhq/den/registry"
)

// CreateOptions asks for a new VM; zero fields take the defaults.
type CreateOptions struct {
	Name        string
	Owner       string
	Image       string
	CPUs        int
	MemoryBytes int64
	DiskBytes   int64
	// IdleTimeout < 0 takes the default; 0 never sleeps.
	IdleTimeout time.Duration
	// Cold boots the VM instead of restoring the image's warm base
	// snapshot.
	Cold bool
	// Egress is the VM's egress policy; nil takes the daemon's default.
	Egress *egress.Policy
	// RestartOnHostLoss boots the VM on the cluster host that takes it
	// over when the host that runs it is lost (lease.go).
	RestartOnHostLoss bool
}

// Progress receives one line per step of a long operation.
type Progress func(step string)

// spec is what den keeps per VM beside the registry columns (SpecJSON).
type spec struct {
	// KernelFile and InitramfsFile are the volume paths of what the VM
	// boots, by content (bootfiles.go); Kernel and Initramfs, host paths
	// in the image directory, are what VMs made before booted.
	KernelFile    string `json:"kernel_file,omitempty"`
	InitramfsFile string `json:"initramfs_file,omitempty"`
	Kernel        string `json:"kernel,omitempty"`
	Initramfs     string `json:"initramfs,omitempty"`
	Cmdline       string `json:"cmdline"`
	BaseImage     string `json:"base_image"` // volume path of the disk it was cloned from
	// Head is the checkpoint the VM's state descends from (the parent
	// of its next checkpoint).
	Head string `json:"head,omitempty"`
	// Restoring is the checkpoint a restore in progress brings back; a
	// crash leaves it set, and the restore is finished on the next start.
	Restoring string `json:"restoring,omitempty"`
	// ForkedFrom is "vm@checkpoint" for a VM made by den fork.
	ForkedFrom string `json:"forked_from,omitempty"`
	// SuspendSeal is the seal id of the suspend slot's digests.
	SuspendSeal string `json:"suspend_seal,omitempty"`
	// AutoCheckpoint is "vm@checkpoint" that a fork took of its source
	// to fork from: removed again if the fork is rolled back.
	AutoCheckpoint string `json:"auto_checkpoint,omitempty"`
	// MAC is the VM's own network hardware address (a fork gets a new
	// one), where its VMM gives it a network device.
	MAC string `json:"mac,omitempty"`
	// Net is the VM's subnet and TAP on the host (tap networking; a
	// fork gets its own).
	Net *network.Lease `json:"net,omitempty"`
	// Egress is the VM's egress policy (egress.Parse); empty: the
	// daemon's default.
	Egress string `json:"egress,omitempty"`
	// URLPort, URLPublic and URLToken are the VM's HTTP URL (url.go); a
	// fork gets its own token.
	URLPort   int    `json:"url_port,omitempty"`
	URLPublic bool   `json:"url_public,omitempty"`
	URLToken  string `json:"url_token,omitempty"`
	// Identity is the VM's identity token (den.identity= on its kernel
	// command line): a guest whose disk has another token takes a new
	// hostname, machine-id and host keys before its services start.
	Identity string `json:"identity,omitempty"`
	// Schedule is the VM's checkpoint schedule, if any (schedule.go); a
	// fork gets none.
	Schedule *Schedule `json:"schedule,omitempty"`
	// RestartOnHostLoss: see CreateOptions.
	RestartOnHostLoss bool `json:"restart_on_host_loss,omitempty"`
}

// newMAC is a new locally administered unicast hardware address.
func newMAC() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	b[0] = b[0]&0xfe | 0x02
	return net.HardwareAddr(b[:]).String()
}

// newToken is a new identity token: 32 lower-case hex digits.
func newToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

// MaxDisk bounds a VM disk (the disk is sparse: it takes what is written).
const MaxDisk = 2 << 40

// checkSizes applies defaults (to zero sizes only) and refuses
// impossible sizes: one that is negative, not whole MiB, below the
// minimum (for the disk: the image's disk) or above what the host has is
// an error, never rounded or replaced. A default disk smaller than the
// image's disk is the image's size.
func (dk *disks) checkSizes(o *CreateOptions) error {
	if o.CPUs == 0 {
		o.CPUs = DefaultCPUs
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = DefaultMemory
	}
	diskDefault := o.DiskBytes == 0
	if diskDefault {
		o.DiskBytes = DefaultDisk
	}
	if o.IdleTimeout < 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if err := checkMiB("memory", o.MemoryBytes); err != nil {
		return err
	}
	if err := checkMiB("disk", o.DiskBytes); err != nil {
		return err
	}
	if n := runtime.NumCPU(); o.CPUs < 1 || o.CPUs > n {
		return fmt.Errorf("bad cpus %d: this host has %d: %w", o.CPUs, n, ErrInvalid)
	}
	if o.MemoryBytes < MinMemory {
		return fmt.Errorf("memory %s is too small: at least %s: %w", FormatSize(o.MemoryBytes), FormatSize(MinMemory), ErrInvalid)
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		total := int64(si.Totalram) * int64(si.Unit)
		if o.MemoryBytes > total {
			return fmt.Errorf("memory %s is more than this host has (%s): %w", FormatSize(o.MemoryBytes), FormatSize(total), ErrInvalid)
		}
	}
	if least := dk.imageDiskSize(o.Image); o.DiskBytes < least {
		if !diskDefault {
			return fmt.Errorf("disk %s is smaller than image %s's disk: at least %s: %w", FormatSize(o.DiskBytes), o.Image, FormatSize(least), ErrInvalid)
		}
		o.DiskBytes = least
	}
	if o.DiskBytes > MaxDisk {
		return fmt.Errorf("disk %s is too large: at most %s: %w", FormatSize(o.DiskBytes), FormatSize(MaxDisk), ErrInvalid)
	}
	if free, err := dk.m.guard.volumeFree(); err == nil && o.DiskBytes > free {
		return fmt.Errorf("disk %s does not fit: the volume has %s free: %w", FormatSize(o.DiskBytes), FormatSize(free), ErrNoSpace)
	}
	return nil
}

// imageDiskSize is the size of an image's root disk, the least a VM's
// disk can be; 0 when the image is unknown (baseImage says why).
func (dk *disks) imageDiskSize(name string) int64 {
	man, err := dk.m.cfg.Images.Manifest()
	if err != nil {
		return 0
	}
	if _, ok := man.Artifact(name); !ok {
		return 0
	}
	st, err := os.Stat(dk.m.cfg.Images.RootDisk(name))
	if err != nil {
		return 0
	}
	return st.Size()
}

// Create makes a new VM: a clone of the image's base disk, a VMM booting
// it (or restoring the image's warm base), and the agent answering.
// Anything half-done is rolled back on failure.
func (m *Manager) Create(ctx context.Context, o CreateOptions, progress Progress) (_ registry.VM, err error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := ValidateName(o.Name); err != nil {
		return registry.VM{}, err
	}
	if o.Image == "" {
		o.Image = m.cfg.DefaultImage
	}
	if o.Owner == "" {
		o.Owner = registry.DefaultOwner
	}
	if err := validate.User(o.Owner); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: owner: %w", o.Name, err)
	}
	end := phase.Begin(ctx, "check image and sizes")
	if err := m.bases.checkImage(o.Image); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	diskDefault := o.DiskBytes == 0
	if err := m.disks.checkSizes(&o); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	end()
	end = phase.Begin(ctx, "check space")
	if err := m.guard.needSpace(spaceMargin, "create vm "+o.Name); err != nil {
		return registry.VM{}, err
	}
	end()
	op, err := m.beginNew(ctx, o.Name, "create")
	if err != nil {
		return registry.VM{}, err
	}
	defer func() { op.end(err) }()
	if err := nameFree(ctx, m.db, o.Name); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}

	base, baseSize, err := m.bases.baseImage(ctx, o.Image, progress)
	if err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if o.DiskBytes < baseSize {
		if !diskDefault {
			return registry.VM{}, fmt.Errorf("create vm %q: disk %s is smaller than image %s's disk: at least %s: %w", o.Name, FormatSize(o.DiskBytes), o.Image, FormatSize(baseSize), ErrInvalid)
		}
		o.DiskBytes = baseSize
	}
	accel := m.vmms.caps(m.vmmName).Accelerator
	now := time.Now().UTC()
	kernel, err := m.boot.importFile(ctx, m.launch.kernel(), progress)
	if err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	initramfs, err := m.boot.importFile(ctx, m.cfg.Images.Initramfs(), progress)
	if err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	sp := spec{KernelFile: string(kernel), InitramfsFile: string(initramfs), BaseImage: string(base), Identity: newToken(), MAC: newMAC(),
		RestartOnHostLoss: o.RestartOnHostLoss}
	if o.Egress != nil {
		if m.net.host == nil && o.Egress.Mode != egress.AllowAll {
			return registry.VM{}, fmt.Errorf("create vm %q: egress policy %s needs tap networking, and VMs here get %s: %w", o.Name, o.Egress, m.network(), ErrInvalid)
		}
		sp.Egress = o.Egress.String()
	}
	sp.Cmdline = m.launch.cmdline(o.Name, sp.Identity)
	// The lease first: the warm base boots on the network the VM will
	// have.
	if err := m.net.takeLease(ctx, o.Name, &sp, false, &op.undo); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	vm := registry.VM{
		Name: o.Name, Owner: o.Owner, Image: o.Image, CPUs: o.CPUs, MemoryBytes: o.MemoryBytes, DiskBytes: o.DiskBytes,
		State: registry.StateCreating, VMM: m.vmmName, Accel: accel, IdleTimeout: o.IdleTimeout,
		CreatedAt: now, LastActive: now, SpecJSON: mustJSON(sp),
	}
	src := bringUpFrom{disk: base, what: "image " + o.Image, spare: true}
	var warmKey string // the key of the warm base's local memory copy
	if !o.Cold {
		if src, warmKey, err = m.bases.warmSource(ctx, vm, sp, src, progress); err != nil {
			return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
		}
	}
	vm.SpecJSON = mustJSON(sp)
	if err := op.reserve(ctx, vm); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if err := op.bringUp(ctx, src, progress); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if src.memory != "" {
		m.snaps.fillBaseCopy(src.ref, warmKey) // for the next create
	}
	mark := vmEvent(activity.EventBoot, "", "created from "+src.what)
	if in := op.instance(); src.memory != "" && in != nil {
		// What ran in the warm base before its snapshot is not this
		// VM's.
		mark.Cursor = m.records.skipCursor(ctx, in)
	}
	m.records.mark(o.Name, mark)
	return op.vm, nil
}

func mustJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
}
