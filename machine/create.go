package machine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	// AutoCheckpoint is "vm@checkpoint" that a fork took of its source
	// to fork from: removed again if the fork is rolled back.
	AutoCheckpoint string `json:"auto_checkpoint,omitempty"`
	// Identity is the VM's identity token (den.identity= on its kernel
	// command line): a guest whose disk has another token takes a new
	// hostname, machine-id and host keys before its services start.
	Identity string `json:"identity,omitempty"`
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
	if o.DiskBytes > MaxDisk {
		return fmt.Errorf("disk %s is too large: at most %s: %w", FormatSize(o.DiskBytes), FormatSize(MaxDisk), ErrInvalid)
	}
	if free, err := m.volumeFree(); err == nil && o.DiskBytes > free {
		return fmt.Errorf("disk %s does not fit: the volume has %s free: %w", FormatSize(o.DiskBytes), FormatSize(free), ErrNoSpace)
	}
	return nil
}

// Create makes a new VM: a clone of the image's base disk, a VMM booting
// it (or restoring the image's warm base), and the agent answering.
// Anything half-done is rolled back on failure.
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
		o.Owner = registry.DefaultOwner
	}
	if err := m.checkSizes(&o); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if err := m.needSpace(spaceMargin, "create vm "+o.Name); err != nil {
		return registry.VM{}, err
	}
	unlock, err := m.lockVM(ctx, o.Name, "create")
	if err != nil {
		return registry.VM{}, err
	}
	defer unlock()
	if _, err := m.db.GetVM(ctx, o.Name); err == nil {
		return registry.VM{}, fmt.Errorf("create vm %q: a vm of that name exists: %w", o.Name, ErrExists)
	}

	base, baseSize, err := m.baseImage(ctx, o.Image, progress)
	if err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	if o.DiskBytes < baseSize {
		o.DiskBytes = baseSize
	}
	accel, _ := m.Accel()
	now := time.Now().UTC()
	sp := spec{Kernel: m.kernel(), Initramfs: m.cfg.Images.Initramfs(), BaseImage: string(base), Identity: newToken()}
	sp.Cmdline = m.cmdline(o.Name, sp.Identity)
	vm := registry.VM{
		Name: o.Name, Owner: o.Owner, Image: o.Image, CPUs: o.CPUs, MemoryBytes: o.MemoryBytes, DiskBytes: o.DiskBytes,
		State: registry.StateCreating, VMM: m.vmmName, Accel: accel, IdleTimeout: o.IdleTimeout,
		CreatedAt: now, LastActive: now, SpecJSON: mustJSON(sp),
	}
	warm := storage.Path("")
	if !o.Cold {
		if warm, err = m.warmBase(ctx, vm, sp, progress); err != nil {
			m.log.Warn("den: no warm base snapshot, booting instead", "image", o.Image, "err", err)
			warm = ""
		}
	}
	undo := cleanups{log: m.log}
	defer undo.run()
	if vm, err = m.reserve(ctx, vm, &undo); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	src := bringUpFrom{disk: base, what: "image " + o.Image}
	if warm != "" {
		src = bringUpFrom{disk: warm.Join(checkpoint.DiskFile), memory: warm.Join(checkpoint.VMMDir), what: "the warm base of image " + o.Image}
	}
	if vm, err = m.bringUp(ctx, vm, sp, src, &undo, progress); err != nil {
		return registry.VM{}, fmt.Errorf("create vm %q: %w", o.Name, err)
	}
	undo.release()
	return vm, nil
}

// reserve records a new VM as creating (its name is then taken), with
// the undo of everything a rollback must remove for it.
func (m *Manager) reserve(ctx context.Context, vm registry.VM, undo *cleanups) (registry.VM, error) {
	if err := m.db.CreateVM(ctx, vm); err != nil {
		if errors.Is(err, registry.ErrExists) {
			return vm, fmt.Errorf("a vm of that name exists: %w", ErrExists)
		}
		return vm, err
	}
	undo.push("delete the record of vm "+vm.Name, func() error {
		return m.db.DeleteVM(context.WithoutCancel(ctx), vm.Name)
	})
	undo.push("remove the files of vm "+vm.Name, func() error {
		m.destroy(context.WithoutCancel(ctx), vm.Name)
		return nil
	})
	return m.get(ctx, vm.Name)
}

// bringUpFrom is where a new VM's disk and (unless it boots) memory come
// from: an image, a warm base or a checkpoint.
type bringUpFrom struct {
	disk   storage.Path // cloned as the VM's disk
	memory storage.Path // VMM snapshot to restore; "" boots instead
	what   string       // for progress lines
}

// bringUp is the one bring-up of a new VM, for create and fork: clone
// the disk, restore the memory with a new identity (or cold-boot, where
// the guest's initramfs applies the identity on the command line before
// anything reads it), grow the disk and the guest's filesystem to the
// VM's size, and record the VM running.
func (m *Manager) bringUp(ctx context.Context, vm registry.VM, sp spec, from bringUpFrom, undo *cleanups, progress Progress) (registry.VM, error) {
	accel, _ := m.Accel()
	progress("cloning the disk of " + from.what)
	if err := m.vol.Clone(ctx, from.disk, storage.VMDisk(vm.Name)); err != nil {
		return vm, fmt.Errorf("clone disk: %w", err)
	}
	crashpoint("bringup-after-clone")
	cloned, err := m.diskFileSize(vm.Name)
	if err != nil {
		return vm, err
	}
	grow := vm.DiskBytes > cloned
	if from.memory != "" {
		progress("restoring the memory of " + from.what + " (" + vm.VMM + ", " + accel + ")")
		in, err := m.restoreInto(ctx, vm, sp, from.memory)
		if err != nil {
			return vm, err
		}
		progress("new identity")
		if err := m.newIdentity(ctx, in, vm.Name, sp.Identity); err != nil {
			return vm, err
		}
		if grow {
			progress("growing the disk to " + FormatSize(vm.DiskBytes))
			if err := m.growDisk(ctx, vm, in); err != nil {
				return vm, err
			}
		}
	} else {
		if err := m.growDiskFile(vm.Name, vm.DiskBytes); err != nil {
			return vm, err
		}
		progress("booting (" + vm.VMM + ", " + accel + ")")
		if err := m.boot(ctx, vm, sp); err != nil {
			return vm, err
		}
		if grow {
			progress("growing the root filesystem to " + FormatSize(vm.DiskBytes))
			if err := m.growDisk(ctx, vm, m.instance(vm.Name)); err != nil {
				return vm, err
			}
		}
	}
	crashpoint("bringup-before-commit")
	vm, err = m.db.UpdateVMIf(ctx, vm.Name, vm.Generation, func(v *registry.VM) error {
		v.State, v.Reason, v.LastActive = registry.StateRunning, "", time.Now().UTC()
		return nil
	})
	if err != nil {
		return vm, err
	}
	if in := m.instance(vm.Name); in != nil {
		in.reopen() // committed: sessions may come
	}
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
func (m *Manager) kernel() string { return m.drivers[m.vmmName].Kernel(m.cfg.Images) }

// cmdline is a VM's kernel command line: console, root disk, the daemon's
// key for the agent, hostname, identity token and (user-mode) network.
func (m *Manager) cmdline(name, identity string) string {
	parts := []string{
		"console=ttyS0", "root=/dev/vda", "rw", "panic=-1", "loglevel=4",
		agent.AuthorizedKeyArg(m.signer.PublicKey()),
		"den.hostname=" + name,
	}
	if identity != "" {
		// A VM booting with a token its disk has not seen takes a new
		// identity in the initramfs (hostname, machine-id, host keys).
		parts = append(parts, "den.identity="+identity)
	}
	parts = append(parts, m.drivers[m.vmmName].NetCmdline...)
	return strings.Join(parts, " ")
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
	d, err := m.driver(vm.VMM)
	if err != nil {
		return vmm.Config{}, err
	}
	cfg := vmm.Config{
		CPUs: vm.CPUs, MemoryBytes: vm.MemoryBytes,
		Kernel: sp.Kernel, Initramfs: sp.Initramfs, Cmdline: sp.Cmdline,
		Disks: []vmm.Disk{{ID: "root", Path: disk}},
	}
	if d.UserNet {
		cfg.Net = []vmm.Net{{ID: "net0"}}
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
	if err := m.needRAMSpace(vm); err != nil {
		return err
	}
	rd := m.state.Run(vm.Name)
	m.discardRuntime(vm.Name)
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	hv, err := m.newHypervisor(vm.VMM, rd)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := hv.Start(ctx); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	in := newInstance(vm.Name, hv)
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
