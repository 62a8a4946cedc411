package machine

import (
	"context"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
)

// commitRunning records vm running, once its VMM runs: the one commit of
// create, fork, start, wake and restore. It is a compare-and-set on the
// generation the operation read under the VM's lock, with change (if
// any) made to the record too. A VMM whose record does not say running
// must not run on: when the record cannot be written, the VM's instance
// is stopped. Committed, the instance admits sessions.
func (m *Manager) commitRunning(ctx context.Context, vm registry.VM, change func(*registry.VM) error) (registry.VM, error) {
	end := phase.Begin(ctx, "registry")
	rec, err := m.db.UpdateVMIf(ctx, vm.Name, vm.Generation, func(v *registry.VM) error {
		if change != nil {
			if err := change(v); err != nil {
				return err
			}
		}
		v.State, v.Reason, v.LastActive = registry.StateRunning, "", time.Now().UTC()
		return nil
	})
	end()
	in := m.instance(vm.Name)
	if err != nil {
		if in != nil {
			m.stopInstance(ctx, in, stopQuit)
		}
		return vm, err
	}
	if in != nil {
		in.reopen()
	}
	return rec, nil
}
