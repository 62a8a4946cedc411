package machine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/denhq/den/registry"
)

// Status is a VM's record checked against reality, with live figures.
type Status struct {
	registry.VM
	PID int
	// Host is the cluster host that runs it ("" on a host of its own,
	// or when it does not run here).
	Host     string
	DiskUsed int64
	// DiskMeasuring: the disk's use is being measured, and DiskUsed is
	// the last figure (0 when there is none): a listing waits only so long
	// for the measures.
	DiskMeasuring bool
	// Op is the operation holding the VM now ("" when none), for OpFor.
	Op    string
	OpFor time.Duration
	// Net is "tap", "user" or "none"; IP the guest's address with its
	// prefix; Egress its egress policy.
	Net, IP, Egress string
	// Cgroup is the running VMM's cgroup, its limits and use; nil
	// when it has none.
	Cgroup *CgroupStatus
}

// get reads a VM's record; ErrNotFound wrapped with the name.
func (m *Manager) get(ctx context.Context, name string) (registry.VM, error) {
	vm, err := m.db.GetVM(ctx, name)
	if errors.Is(err, registry.ErrNotFound) {
		return vm, fmt.Errorf("no vm named %q: %w", name, ErrNotFound)
	}
	return vm, err
}

// Get returns a VM's status. A VM recorded as running whose VMM is gone
// is reported (and recorded) as stopped, but only by the VM's owner
// under its lock (reconcileVM): a read racing an operation changes
// nothing.
func (m *Manager) Get(ctx context.Context, name string) (Status, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return Status{}, err
	}
	return m.status(ctx, vm, true), nil
}

// Brief is Get without measuring the disk's use: DiskUsed is the last
// figure measured. It answers lifecycle verbs (wake, sleep, restore,
// create), which should not pay for a juicefs process each.
func (m *Manager) Brief(ctx context.Context, name string) (Status, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return Status{}, err
	}
	return m.status(ctx, vm, false), nil
}

// Record returns a VM's record as it is, without looking at (or
// reconciling) the VM: for authorisation, which comes before any read of
// the VM, and for tests.
func (m *Manager) Record(ctx context.Context, name string) (registry.VM, error) {
	return m.get(ctx, name)
}

// List returns every VM (of owner, when set) with its status.
func (m *Manager) List(ctx context.Context, owner string) ([]Status, error) {
	vms, err := m.db.ListVMs(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(vms))
	for _, vm := range vms {
		out = append(out, m.status(ctx, vm, false))
	}
	m.usage.fill(ctx, out)
	return out, nil
}

// status checks a record against the live instance, with live figures;
// the disk's use is measured afresh when measure says so (unless the
// figure still holds: usage.go), else the last figure.
func (m *Manager) status(ctx context.Context, vm registry.VM, measure bool) Status {
	in := m.procs.instance(vm.Name)
	if vm.State == registry.StateRunning && (in == nil || !alive(in)) {
		if fresh, err := m.locks.reconcileVM(ctx, vm.Name); err == nil {
			vm, in = fresh, m.procs.instance(vm.Name)
		}
	}
	st := Status{VM: vm}
	st.Op, st.OpFor = m.Op(vm.Name)
	if sp, err := decodeSpec(vm); err == nil {
		st.Net, st.IP, st.Egress = m.net.summary(vm, sp)
	}
	st.DiskUsed = m.usage.used(ctx, vm, measure)
	if vm.State == registry.StateRunning && in != nil && alive(in) {
		st.PID = in.hv.PID()
		if m.cfg.Leases != nil {
			st.Host = m.here.name
		}
		st.Cgroup = m.conf.status(vm.Name)
		sessions, last := in.activity()
		if sessions > 0 {
			st.LastActive = time.Now().UTC()
		} else if last.After(st.LastActive) {
			st.LastActive = last.UTC()
		}
	}
	return st
}

// Remove deletes a VM: its VMM (the guest is asked to power off first
// unless force), its disk and checkpoints, and its record.
func (m *Manager) Remove(ctx context.Context, name string, force bool) (err error) {
	o, err := m.beginAnySpec(ctx, name, "rm")
	if err != nil {
		return err
	}
	defer func() { o.end(err) }()
	if err := o.update(ctx, func(v *registry.VM, _ *spec) error {
		v.State = registry.StateDeleting
		return nil
	}); err != nil {
		return fmt.Errorf("remove vm %q: %w", name, err)
	}
	crashpoint("rm-after-mark")
	if in := o.instance(); in != nil {
		in.close(true)
		how := stopGraceful
		if force {
			how = stopQuit
		}
		m.procs.stopInstance(ctx, in, how)
	}
	m.procs.destroy(ctx, name)
	m.usage.forget(name)
	m.snaps.memc.drop(name, "")
	m.snaps.spares.dropVM(ctx, name)
	_ = os.RemoveAll(m.state.Run(name).Path())
	if err := m.db.DeleteCheckpoints(ctx, name); err != nil {
		return fmt.Errorf("remove vm %q: %w", name, err)
	}
	if err := m.db.DeleteVM(ctx, name); err != nil {
		return fmt.Errorf("remove vm %q: %w", name, err)
	}
	m.gc.poke()
	return nil
}

// Logs writes the VM's VMM log and guest console to w.
func (m *Manager) Logs(ctx context.Context, name string, w io.Writer) error {
	vm, err := m.get(ctx, name)
	if err != nil {
		return err
	}
	rd := m.state.Run(vm.Name)
	for _, f := range []struct{ title, path string }{{"vmm log", rd.Log()}, {"console", rd.ConsoleLog()}} {
		fmt.Fprintf(w, "==> %s (%s) <==\n", f.title, f.path)
		data, err := os.ReadFile(f.path)
		if err != nil {
			fmt.Fprintf(w, "(none: %v)\n", errors.Unwrap(err))
			continue
		}
		if !strings.HasSuffix(string(data), "\n") && len(data) > 0 {
			data = append(data, '\n')
		}
		_, _ = w.Write(data)
	}
	return nil
}

// Running is the number of VMs with a live VMM process.
func (m *Manager) Running() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, in := range m.instances {
		if alive(in) {
			n++
		}
	}
	return n
}
