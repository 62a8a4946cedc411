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
	"github.com/denhq/den/storage"
)

// Status is a VM's record checked against reality, with live figures.
type Status struct {
	registry.VM
	PID      int
	DiskUsed int64
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
// is reported (and recorded) as stopped.
func (m *Manager) Get(ctx context.Context, name string) (Status, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return Status{}, err
	}
	return m.status(ctx, vm), nil
}

// List returns every VM (of owner, when set) with its status.
func (m *Manager) List(ctx context.Context, owner string) ([]Status, error) {
	vms, err := m.db.ListVMs(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(vms))
	for _, vm := range vms {
		out = append(out, m.status(ctx, vm))
	}
	return out, nil
}

// status checks a record against the live instance.
func (m *Manager) status(ctx context.Context, vm registry.VM) Status {
	st := Status{VM: vm}
	if u, err := m.vol.Usage(ctx, storage.VMDisk(vm.Name)); err == nil {
		st.DiskUsed = u.Data
	}
	in := m.instance(vm.Name)
	if vm.State == registry.StateRunning && !m.isBusy(vm.Name) {
		if in == nil || !alive(in) {
			reason := "vmm process not found"
			if in != nil && in.hv.ExitErr() != nil {
				reason = "vmm exited: " + in.hv.ExitErr().Error()
			}
			m.markStopped(vm.Name, reason)
			st.State, st.Reason = registry.StateStopped, reason
			return st
		}
	}
	if vm.State == registry.StateRunning && in != nil {
		st.PID = in.hv.PID()
		in.actMu.Lock()
		if in.sessions > 0 {
			st.LastActive = time.Now().UTC()
		} else if in.lastAct.After(st.LastActive) {
			st.LastActive = in.lastAct.UTC()
		}
		in.actMu.Unlock()
	}
	return st
}

func alive(in *instance) bool {
	select {
	case <-in.hv.Exited():
		return false
	default:
		return true
	}
}

// Remove deletes a VM: its VMM (the guest is asked to power off first
// unless force), its disk and checkpoints, and its record.
func (m *Manager) Remove(ctx context.Context, name string, force bool) error {
	vm, err := m.get(ctx, name)
	if err != nil {
		return err
	}
	unlock, err := m.lockVM(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := m.db.UpdateVM(ctx, name, func(v *registry.VM) error {
		v.State = registry.StateDeleting
		return nil
	}); err != nil {
		return fmt.Errorf("remove vm %q: %w", name, err)
	}
	if in := m.instance(name); in != nil {
		m.stopInstance(ctx, in, !force)
	}
	m.destroy(ctx, name, vm.VMM)
	_ = os.RemoveAll(m.state.Run(name).Path())
	_ = os.Remove(m.state.Lock(name))
	if err := m.db.DeleteCheckpoints(ctx, name); err != nil {
		return fmt.Errorf("remove vm %q: %w", name, err)
	}
	if err := m.db.DeleteVM(ctx, name); err != nil {
		return fmt.Errorf("remove vm %q: %w", name, err)
	}
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

// watchVolume tells the log which VMs a volume outage touches: their
// disks are files on it, and a VMM's open disk does not survive the mount
// process dying (the supervisor remounts the volume for new opens).
func (m *Manager) watchVolume() {
	events, stop := m.vol.Subscribe()
	defer stop()
	for {
		select {
		case <-m.closed:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind != storage.EventLost && ev.Kind != storage.EventRemounted {
				continue
			}
			var names []string
			m.mu.Lock()
			for name := range m.instances {
				names = append(names, name)
			}
			m.mu.Unlock()
			m.log.Warn("den: storage volume "+string(ev.Kind)+"; running vms may see disk errors until they are restarted",
				"vms", strings.Join(names, ","), "detail", ev.Detail, "err", ev.Err)
		}
	}
}
