package machine

import (
	"context"
	"time"

	"github.com/denhq/den/idle"
	"github.com/denhq/den/registry"
)

// IdleTarget is the Manager as the idle monitor sees it.
func (m *Manager) IdleTarget() idle.Target { return idleTarget{m} }

type idleTarget struct{ m *Manager }

var _ idle.Target = idleTarget{}

// Candidates are the running VMs with an idle timeout.
func (t idleTarget) Candidates(ctx context.Context) []idle.VM {
	vms, err := t.m.db.ListVMs(ctx, "")
	if err != nil {
		return nil
	}
	var out []idle.VM
	for _, vm := range vms {
		in := t.m.procs.instance(vm.Name)
		if vm.State != registry.StateRunning || vm.IdleTimeout <= 0 || in == nil || !alive(in) {
			continue
		}
		in.actMu.Lock()
		c := idle.VM{Name: vm.Name, Timeout: vm.IdleTimeout, LastActive: in.lastAct, Sessions: in.sessions}
		in.actMu.Unlock()
		if vm.LastActive.After(c.LastActive) {
			c.LastActive = vm.LastActive
		}
		out = append(out, c)
	}
	return out
}

// Activity asks the guest agent how busy the guest is.
func (t idleTarget) Activity(ctx context.Context, name string) (idle.Sample, error) {
	in := t.m.procs.instance(name)
	if in == nil {
		return idle.Sample{}, ErrNotFound
	}
	c, err := t.m.agents.agentClient(ctx, in)
	if err != nil {
		return idle.Sample{}, err
	}
	a, err := c.Activity(ctx)
	if err != nil {
		return idle.Sample{}, err
	}
	return idle.Sample{Time: a.Time, CPUBusy: a.CPUBusy, CPUTotal: a.CPUTotal, AgentCPU: a.AgentCPU,
		Sessions: a.Sessions + a.Forwards, Held: a.Held(time.Now())}, nil
}

// Touch records activity now.
func (t idleTarget) Touch(name string) {
	if in := t.m.procs.instance(name); in != nil {
		in.actMu.Lock()
		in.lastAct = time.Now()
		in.actMu.Unlock()
	}
}

// Sleep puts the VM to sleep unless a session opened meanwhile.
func (t idleTarget) Sleep(ctx context.Context, name string) error {
	return t.m.Sleep(ctx, name, false)
}
