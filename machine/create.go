package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/fsutil"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
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
}

// Progress receives one line per step of a long operation.
type Progress func(step string)

// spec is what den keeps per VM beside the registry columns (SpecJSON).
type spec struct {
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs"`
	Cmdline   string `json:"cmdline"`
	BaseImage string `json:"base_image"` // volume path of the disk it was cloned from
	// Head is the checkpoint the VM's state descends from (the parent
	// of its next checkpoint).
	Head string `json:"head,omitempty"`
	// Restoring is the checkpoint a restore in progress brings back; a
	// crash leaves it set, and the restore is finished on the next start.
	Restoring string `json:"restoring,omitempty"`
	// ForkedFrom is "vm@checkpoint" for a VM made by den fork.
	ForkedFrom string `json:"forked_from,omitempty"`
}

// MaxDisk bounds a VM disk (the disk is sparse: it takes what is written).
const MaxDisk = 2 << 40

// checkSizes applies defaults and refuses impossible sizes.
func (m *Manager) checkSizes(o *CreateOptions) error {
	if o.CPUs == 0 {
		o.CPUs = DefaultCPUs
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = DefaultMemory
	}
	if o.DiskBytes == 0 {
		o.DiskBytes = DefaultDisk
	}
	if o.IdleTimeout < 0 {
		o.IdleTimeout = DefaultIdleTimeout
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
	if o.DiskBytes > MaxDisk {
		return fmt.Errorf("disk %s is too large: at most %s: %w", FormatSize(o.DiskBytes), FormatSize(MaxDisk), ErrInvalid)
	}
	if free, err := m.volumeFree(); err == nil && o.DiskBytes > free {
		return fmt.Errorf("disk %s does not fit: the volume has %s free: %w", FormatSize(o.DiskBytes), FormatSize(free), ErrNoSpace)
	}
	return nil
}

// volumeFree is the free space where the volume's data lands: the mount
// and, for the embedded volume, the local disk under it.
func (m *Manager) volumeFree() (int64, error) {
	free := int64(-1)
	for _, p := range []string{m.vol.Root(), m.state.VolumeState()} {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			continue
		}
		f := int64(st.Bavail) * st.Bsize
		if free < 0 || f < free {
			free = f
		}
	}
	if free < 0 {
		return 0, errors.New("volume free space unknown")
	}
	return free, nil
}

// Create makes a new VM: a clone of the image's base disk, a VMM booting
// it, and the agent answering. Anything half-done is rolled back on
// failure.
func (m *Manager) Create(ctx context.Context, o CreateOptions, progress Progress) (registry.VM, error) {
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
		o.Owner = "default"
	}
	if err := m.checkSizes(&o); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	unlock, err := m.lockVM(ctx, o.Name)
	if err != nil {
		return registry.VM{}, err
	}
	defer unlock()

	base, baseSize, err := m.baseImage(ctx, o.Image, progress)
	if err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if o.DiskBytes < baseSize {
		o.DiskBytes = baseSize
	}
	accel, _ := m.Accel()
	now := time.Now().UTC()
	sp := spec{Kernel: m.kernel(), Initramfs: m.cfg.Images.Initramfs(), BaseImage: string(base)}
	sp.Cmdline = m.cmdline(o.Name)
	vm := registry.VM{
		Name: o.Name, Owner: o.Owner, Image: o.Image, CPUs: o.CPUs, MemoryBytes: o.MemoryBytes, DiskBytes: o.DiskBytes,
		State: registry.StateCreating, VMM: m.vmmName, Accel: accel, IdleTimeout: o.IdleTimeout,
		CreatedAt: now, LastActive: now, SpecJSON: mustJSON(sp),
	}
	if err := m.db.CreateVM(ctx, vm); err != nil {
		if errors.Is(err, registry.ErrExists) {
			return registry.VM{}, fmt.Errorf("create vm %q: a vm of that name exists: %w", o.Name, ErrExists)
		}
		return registry.VM{}, err
	}
	var undo cleanups
	defer undo.run()
	undo.push(func() { _ = m.db.DeleteVM(context.Background(), o.Name) })

	undo.push(func() { m.destroy(context.Background(), o.Name, vm.VMM) })
	warm := storage.Path("")
	if !o.Cold {
		if warm, err = m.warmBase(ctx, vm, sp, progress); err != nil {
			m.log.Warn("den: no warm base snapshot, booting instead", "image", o.Image, "err", err)
			warm = ""
		}
	}
	if warm != "" {
		progress("cloning the warm base of image " + o.Image)
		err = m.vol.Clone(ctx, warm.Join(checkpoint.DiskFile), storage.VMDisk(o.Name))
	} else {
		progress("cloning disk from image " + o.Image)
		err = m.vol.Clone(ctx, base, storage.VMDisk(o.Name))
	}
	if err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: clone disk: %w", o.Name, err)
	}
	if err := m.growDisk(o.Name, o.DiskBytes); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if warm != "" {
		progress("restoring the warm base (" + m.vmmName + ", " + accel + ")")
		in, err := m.restoreInto(ctx, vm, sp, warm.Join(checkpoint.VMMDir))
		if err != nil {
			return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
		}
		progress("new identity")
		if err := m.newIdentity(ctx, in, o.Name); err != nil {
			return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
		}
	} else {
		progress("booting (" + m.vmmName + ", " + accel + ")")
		if err := m.boot(ctx, vm, sp); err != nil {
			return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
		}
	}
	vm, err = m.db.UpdateVM(ctx, o.Name, func(v *registry.VM) error {
		v.State = registry.StateRunning
		v.LastActive = time.Now().UTC()
		return nil
	})
	if err != nil {
		return registry.VM{}, err
	}
	undo.release()
	return vm, nil
}

func mustJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
}

// kernel is the kernel form the chosen VMM boots.
func (m *Manager) kernel() string {
	if m.vmmName == VMMCloudHypervisor {
		return m.cfg.Images.Vmlinux()
	}
	return m.cfg.Images.BzImage()
}

// cmdline is a VM's kernel command line: console, root disk, the daemon's
// key for the agent, hostname and (user-mode) network.
func (m *Manager) cmdline(name string) string {
	parts := []string{
		"console=ttyS0", "root=/dev/vda", "rw", "panic=-1", "loglevel=4",
		agent.AuthorizedKeyArg(m.signer.PublicKey()),
		"den.hostname=" + name,
	}
	if m.vmmName == VMMQEMU {
		// QEMU's user-mode network: the guest is 10.0.2.15 behind NAT.
		parts = append(parts, "den.ip=10.0.2.15/24", "den.gw=10.0.2.2", "den.dns=10.0.2.3")
	}
	return strings.Join(parts, " ")
}

// growDisk extends a cloned disk to the asked size (never shrinks it).
func (m *Manager) growDisk(name string, size int64) error {
	p, err := m.vol.Path(storage.VMDisk(name))
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if st.Size() >= size {
		return nil
	}
	if err := os.Truncate(p, size); err != nil {
		return fmt.Errorf("grow disk to %s: %w", FormatSize(size), err)
	}
	return nil
}

// vmmConfig is the VMM config of a VM.
func (m *Manager) vmmConfig(vm registry.VM, sp spec) (vmm.Config, error) {
	return m.vmmConfigDisk(vm, sp, storage.VMDisk(vm.Name))
}

// vmmConfigDisk is the VMM config of a VM booting from diskPath.
func (m *Manager) vmmConfigDisk(vm registry.VM, sp spec, diskPath storage.Path) (vmm.Config, error) {
	disk, err := m.vol.Path(diskPath)
	if err != nil {
		return vmm.Config{}, err
	}
	cfg := vmm.Config{
		CPUs: vm.CPUs, MemoryBytes: vm.MemoryBytes,
		Kernel: sp.Kernel, Initramfs: sp.Initramfs, Cmdline: sp.Cmdline,
		Disks: []vmm.Disk{{ID: "root", Path: disk}},
		Net:   []vmm.Net{{ID: "net0"}},
	}
	if vm.VMM == VMMCloudHypervisor {
		cfg.Net = nil // TAP networking is not set up by den yet
	}
	return cfg, nil
}

// boot starts a VMM for vm, boots it, and waits for the agent. On failure
// the VMM is stopped and the error carries the console's last lines.
func (m *Manager) boot(ctx context.Context, vm registry.VM, sp spec) error {
	cfg, err := m.vmmConfig(vm, sp)
	if err != nil {
		return err
	}
	rd := m.state.Run(vm.Name)
	m.discardRuntime(vm.Name)
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	hv := m.newHypervisor(vm.VMM, rd)
	if err := hv.Start(ctx); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	in := &instance{name: vm.Name, hv: hv, stopping: make(chan struct{}), lastAct: time.Now()}
	fail := func(err error) error {
		close(in.stopping)
		in.closeAgent()
		_ = hv.Shutdown(context.Background())
		return fmt.Errorf("boot: %w%s", err, consoleHint(rd))
	}
	if err := hv.Create(ctx, cfg); err != nil {
		return fail(err)
	}
	if err := hv.Boot(ctx); err != nil {
		return fail(err)
	}
	if err := m.connectAgent(ctx, in, m.cfg.BootTimeout); err != nil {
		return fail(err)
	}
	m.setInstance(in)
	go m.watch(in)
	return nil
}

// consoleHint is the end of the guest console, for boot errors.
func consoleHint(rd vmm.RunDir) string {
	tail := vmm.TailFile(rd.ConsoleLog(), 400)
	if tail == "" {
		return ""
	}
	return " (console: ..." + tail + ")"
}

// discardRuntime removes a VM's runtime directory (sockets, RAM file,
// logs) once no VMM uses it.
func (m *Manager) discardRuntime(name string) {
	rd := m.state.Run(name)
	for _, p := range []string{rd.MemoryFile(), rd.APISocket(), rd.AgentSocket(), rd.VsockSocket(), rd.PIDFile()} {
		_ = os.Remove(p)
	}
}

// baseImage makes sure the image's root disk is on the volume (imported
// once per image build) and returns its volume path and size.
func (m *Manager) baseImage(ctx context.Context, name string, progress Progress) (storage.Path, int64, error) {
	man, err := m.cfg.Images.Manifest()
	if err != nil {
		return "", 0, fmt.Errorf("image %q: %w (build images with `make image`)", name, err)
	}
	art, ok := man.Artifact(name)
	if !ok {
		return "", 0, fmt.Errorf("image %q: no such image in %s: %w", name, m.cfg.Images.Path(), ErrInvalid)
	}
	key := art.Key
	if len(key) > 16 {
		key = key[:16]
	}
	p := storage.ImageFile(name, "disk-"+key+".raw")
	host, err := m.vol.Path(p)
	if err != nil {
		return "", 0, err
	}
	if st, err := os.Stat(host); err == nil {
		return p, st.Size(), nil
	}
	m.imageMu.Lock()
	defer m.imageMu.Unlock()
	if st, err := os.Stat(host); err == nil {
		return p, st.Size(), nil
	}
	progress("importing image " + name + " onto the volume (once per image build)")
	if err := m.vol.MkdirAll(ctx, storage.ImageDir(name)); err != nil {
		return "", 0, err
	}
	tmp := storage.ImageFile(name, "import-"+key+".tmp")
	tmpHost, err := m.vol.Path(tmp)
	if err != nil {
		return "", 0, err
	}
	if err := fsutil.CopySparse(m.cfg.Images.RootDisk(name), tmpHost); err != nil {
		_ = m.vol.Remove(ctx, tmp)
		return "", 0, fmt.Errorf("import image %q: %w", name, err)
	}
	if err := m.vol.Rename(ctx, tmp, p); err != nil {
		_ = m.vol.Remove(ctx, tmp)
		return "", 0, fmt.Errorf("import image %q: %w", name, err)
	}
	st, err := os.Stat(host)
	if err != nil {
		return "", 0, err
	}
	return p, st.Size(), nil
}
