package machine

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/network"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// kernel is the image's kernel in the form the chosen VMM boots.
func (l *launcher) kernel() string {
	if l.m.vmms.caps(l.m.vmmName).Kernel == vmm.KernelVmlinux {
		return l.m.cfg.Images.Vmlinux()
	}
	return l.m.cfg.Images.BzImage()
}

// cmdline is a VM's kernel command line: console, root disk, the daemon's
// key for the agent, hostname and identity token (the network's arguments
// are added when a VMM starts: vmmConfigDisk).
func (l *launcher) cmdline(name, identity string) string {
	parts := []string{
		"console=ttyS0", "root=/dev/vda", "rw", "panic=-1", "loglevel=4",
		agent.AuthorizedKeyArg(l.m.signer.PublicKey()),
		"den.hostname=" + name,
	}
	if identity != "" {
		// A VM booting with a token its disk has not seen takes a new
		// identity in the initramfs (hostname, machine-id, host keys).
		parts = append(parts, "den.identity="+identity)
	}
	return strings.Join(parts, " ")
}

// vmmConfig is the VMM config of a VM.
func (l *launcher) vmmConfig(vm registry.VM, sp spec) (vmm.Config, error) {
	return l.vmmConfigDisk(vm, sp, storage.VMDisk(vm.Name))
}

// vmmConfigDisk is the VMM config of a VM booting from diskPath.
func (l *launcher) vmmConfigDisk(vm registry.VM, sp spec, diskPath storage.Path) (vmm.Config, error) {
	disk, err := l.m.vol.Path(diskPath)
	if err != nil {
		return vmm.Config{}, err
	}
	if _, err := l.m.vmms.driver(vm.VMM); err != nil {
		return vmm.Config{}, err
	}
	kernel, initramfs, err := l.bootPaths(sp)
	if err != nil {
		return vmm.Config{}, err
	}
	cfg := vmm.Config{
		CPUs: vm.CPUs, MemoryBytes: vm.MemoryBytes,
		Kernel: kernel, Initramfs: initramfs, Cmdline: sp.Cmdline,
		Disks: []vmm.Disk{{ID: "root", Path: disk}},
	}
	if g, nets, ok := l.m.net.guest(vm, sp); ok {
		cfg.Cmdline, cfg.Net = network.WithCmdline(sp.Cmdline, g), nets
	}
	return cfg, nil
}

// boot starts a VMM for vm, boots it, and waits for the agent. On failure
// the VMM is stopped and the error carries the console's last lines.
func (l *launcher) boot(ctx context.Context, vm registry.VM, sp spec) error {
	cfg, err := l.vmmConfig(vm, sp)
	if err != nil {
		return err
	}
	if err := l.m.guard.needRAMSpace(vm, 0); err != nil {
		return err
	}
	release, err := l.m.budget.admitMemory(ctx, vm)
	if err != nil {
		return err
	}
	defer release()
	if err := l.m.guard.waitDisk(ctx, vm.Name); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := l.m.net.up(ctx, vm.Name, sp); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	rd := l.m.state.Run(vm.Name)
	l.discardRuntime(vm.Name)
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := l.m.conf.start(vm.Name, vm.CPUs, vm.MemoryBytes); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	hv, err := l.m.vmms.newHypervisor(vm.VMM, rd)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := hv.Start(ctx); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	in := newInstance(vm.Name, vm.VMM, hv)
	if err := l.bootInstance(ctx, in, cfg); err != nil {
		in.abandon()
		return fmt.Errorf("boot: %w%s", err, consoleHint(rd))
	}
	l.m.procs.setInstance(in)
	go l.m.procs.watch(in)
	return nil
}

// bootInstance creates and boots the VM in its started VMM and waits for
// the guest's agent.
func (l *launcher) bootInstance(ctx context.Context, in *instance, cfg vmm.Config) error {
	end := phase.Begin(ctx, "vmm create and boot")
	err := in.hv.Create(ctx, cfg)
	if err == nil {
		err = in.hv.Boot(ctx)
	}
	end()
	if err != nil {
		return err
	}
	defer phase.Begin(ctx, "guest boot to agent")()
	_, err = l.m.agents.connectAgent(ctx, in, l.m.cfg.BootTimeout)
	return err
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
func (l *launcher) discardRuntime(name string) {
	rd := l.m.state.Run(name)
	for _, p := range []string{rd.MemoryFile(), rd.APISocket(), rd.AgentSocket(), rd.VsockSocket(), rd.PIDFile()} {
		_ = os.Remove(p)
	}
	l.m.ram.discard(name)
	l.m.conf.drop(name)
}

// launcher writes a VM's VMM config and cold-boots it (boot.go).
type launcher struct{ m *Manager }
