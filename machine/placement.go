package machine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// HostInfo is what this host runs VMs with: for the daemon's info, and
// for its record in a cluster, whose placement reads Compat.
type HostInfo struct {
	// Name is the host's name (Config.HostName, else the hostname).
	Name string
	// VMM is the VMM new VMs run under; Accel its accelerator ("kvm" or
	// "tcg"), and AccelNote why.
	VMM, Accel, AccelNote string
	// Network is what VMs here get (tap, or user networking and why).
	Network string
	// GuestRAM is where guests' memory lives.
	GuestRAM string
	// Compat is, for each VMM here, what a memory snapshot taken by it
	// records of this host (JSON): Need.RestorableOn compares a
	// snapshot's record with another host's.
	Compat string
}

// Host describes this host.
func (m *Manager) Host() HostInfo {
	own := map[string]snapshotHost{}
	for name := range m.drivers {
		own[name] = m.compat.record(name)
	}
	compat, _ := json.Marshal(own) // (its keys sorted)
	return HostInfo{
		Name: m.here.name, VMM: m.vmmName, Accel: m.vmms.caps(m.vmmName).Accelerator, AccelNote: m.kvm.Reason,
		Network: m.network(), GuestRAM: m.ram.where, Compat: string(compat),
	}
}

// Need is what waking or booting a VM that runs nowhere asks of the host
// that does it: room for its memory, and, when it sleeps, a VMM and CPU
// that restore its memory snapshot.
type Need struct {
	VM string
	// MemoryBytes is its guest RAM plus a VMM's overhead here.
	MemoryBytes int64
	// vmm is the VMM it runs under; snapshot where its memory was put to
	// sleep, or, running, where it will be (nil: it boots from its disk,
	// or the snapshot records no host).
	vmm      string
	snapshot *snapshotHost
}

// Need is what waking vm asks of a host.
func (m *Manager) Need(ctx context.Context, name string) (Need, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return Need{}, err
	}
	n := Need{VM: vm.Name, MemoryBytes: vm.MemoryBytes, vmm: vm.VMM}
	if m.adm != nil && m.adm.budget >= 0 {
		n.MemoryBytes += m.adm.overhead
	}
	switch vm.State {
	case registry.StateRunning:
		// Once it sleeps where it runs (its host asks, to move it), its
		// memory records that host.
		rec := m.compat.record(vm.VMM)
		n.snapshot = &rec
	case registry.StateSleeping:
		if n.snapshot, err = m.compat.read(storage.SuspendDir(vm.Name)); err != nil {
			return n, fmt.Errorf("vm %q: where its memory was put to sleep: %w", name, err)
		}
	}
	return n, nil
}

// RestorableOn says why a host whose HostInfo.Compat is compat cannot
// restore the VM's memory snapshot; nil when it can, when the VM has
// none, or when the host records nothing (a den from before it did).
func (n Need) RestorableOn(host, compat string) error {
	if n.snapshot == nil || compat == "" {
		return nil
	}
	var theirs map[string]snapshotHost
	if err := json.Unmarshal([]byte(compat), &theirs); err != nil {
		return fmt.Errorf("host %s's record of its VMMs: %w", host, err)
	}
	h, ok := theirs[n.vmm]
	if !ok {
		return fmt.Errorf("vm %q runs under %s, which host %s does not have", n.VM, n.vmm, host)
	}
	if err := n.snapshot.restorableOn(h); err != nil {
		return fmt.Errorf("host %s cannot restore vm %q's memory: %w", host, n.VM, err)
	}
	return nil
}
