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
func (m *Manager) kernel() string {
	if m.caps(m.vmmName).Kernel == vmm.KernelVmlinux {
		return m.cfg.Images.Vmlinux()
	}
	return m.cfg.Images.BzImage()
}

// cmdline is a VM's kernel command line: console, root disk, the daemon's
// key for the agent, hostname and identity token (the network's arguments
// are added when a VMM starts: vmmConfigDisk).
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
	if _, err := m.driver(vm.VMM); err != nil {
		return vmm.Config{}, err
	}
	cfg := vmm.Config{
		CPUs: vm.CPUs, MemoryBytes: vm.MemoryBytes,
		Kernel: sp.Kernel, Initramfs: sp.Initramfs, Cmdline: sp.Cmdline,
		Disks: []vmm.Disk{{ID: "root", Path: disk}},
	}
	if g, nets, ok := m.guestNet(vm, sp); ok {
		cfg.Cmdline, cfg.Net = network.WithCmdline(sp.Cmdline, g), nets
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
	if err := m.needRAMSpace(vm, 0); err != nil {
		return err
	}
	release, err := m.admitMemory(ctx, vm)
	if err != nil {
		return err
	}
	defer release()
	if err := m.waitDisk(ctx, vm.Name); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := m.net.up(ctx, vm.Name, sp); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	rd := m.state.Run(vm.Name)
	m.discardRuntime(vm.Name)
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := m.conf.start(vm.Name, vm.CPUs, vm.MemoryBytes); err != nil {
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
	end := phase.Begin(ctx, "vmm create and boot")
	if err := hv.Create(ctx, cfg); err != nil {
		end()
		return fail(err)
	}
	err = hv.Boot(ctx)
	end()
	if err != nil {
		return fail(err)
	}
	end = phase.Begin(ctx, "guest boot to agent")
	_, err = m.connectAgent(ctx, in, m.cfg.BootTimeout)
	end()
	if err != nil {
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
	m.ram.discard(name)
	m.conf.drop(name)
}
