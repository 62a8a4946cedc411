// Package idle decides when a VM is idle and puts it to sleep: den's own
// activity signals (open sessions, last request) and the guest agent's
// (CPU use, agent sessions and forwards, keep-awake leases), measured
// against each VM's idle timeout.
package idle

import (
	"context"
	"log/slog"
	"time"
)

// VM is a running VM the monitor may put to sleep.
type VM struct {
	Name string
	// Timeout is the VM's idle timeout (> 0).
	Timeout time.Duration
	// LastActive is the last time den saw it used.
	LastActive time.Time
	// Sessions open through den (exec, ssh, gateway, forwards).
	Sessions int
}

// Sample is what the guest reports, cumulative where it counts time.
type Sample struct {
	Time     time.Time
	CPUBusy  time.Duration // all CPUs
	CPUTotal time.Duration // all CPUs
	// AgentCPU is the guest agent's own CPU time, in CPUBusy: not the
	// guest's use (its answers to the monitor's requests are most of it
	// in an idle guest).
	AgentCPU time.Duration
	// Sessions and forwards open on the agent itself.
	Sessions int
	// Held: a keep-awake lease is held in the guest.
	Held bool
}

// Target is what the monitor watches and acts on (den's machine layer).
type Target interface {
	// Candidates are the running VMs with an idle timeout.
	Candidates(ctx context.Context) []VM
	// Activity asks a VM's guest agent for a sample.
	Activity(ctx context.Context, name string) (Sample, error)
	// Touch records that a VM was active now.
	Touch(name string)
	// Sleep puts an idle VM to sleep.
	Sleep(ctx context.Context, name string) error
}

// Policy says what counts as idle.
type Policy struct {
	// Interval between passes (default 5 s).
	Interval time.Duration
	// CPUThreshold is the guest CPU use, as a fraction of all its CPUs
	// between two samples, under which the guest counts as idle
	// (default 0.05).
	CPUThreshold float64
}

// Monitor puts VMs to sleep after their idle timeout.
type Monitor struct {
	t      Target
	p      Policy
	log    *slog.Logger
	prev   map[string]Sample
	now    func() time.Time
	asleep func(name string) // test hook: called after a VM was put to sleep
}

// New returns a monitor of t.
func New(t Target, p Policy, log *slog.Logger) *Monitor {
	if p.Interval <= 0 {
		p.Interval = 5 * time.Second
	}
	if p.CPUThreshold <= 0 {
		p.CPUThreshold = 0.05
	}
	if log == nil {
		log = slog.Default()
	}
	return &Monitor{t: t, p: p, log: log, prev: map[string]Sample{}, now: time.Now}
}

// Run makes a pass every interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	tick := time.NewTicker(m.p.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			m.Pass(ctx)
		}
	}
}

// Pass checks every candidate once: busy guests are touched, VMs idle
// past their timeout are put to sleep.
func (m *Monitor) Pass(ctx context.Context) {
	seen := map[string]bool{}
	for _, vm := range m.t.Candidates(ctx) {
		seen[vm.Name] = true
		if vm.Sessions > 0 {
			continue // in use through den right now
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := m.t.Activity(actx, vm.Name)
		cancel()
		if err != nil {
			// A guest that does not answer is not put to sleep on a
			// guess; it is retried next pass.
			m.log.Debug("idle: no activity sample", "vm", vm.Name, "err", err)
			continue
		}
		prev, had := m.prev[vm.Name]
		m.prev[vm.Name] = s
		if Busy(prev, s, had, m.p.CPUThreshold) {
			m.t.Touch(vm.Name)
			continue
		}
		if idleFor := m.now().Sub(vm.LastActive); idleFor >= vm.Timeout {
			m.log.Info("idle: putting vm to sleep", "vm", vm.Name, "idle", idleFor.Round(time.Second))
			if err := m.t.Sleep(ctx, vm.Name); err != nil {
				m.log.Warn("idle: sleep", "vm", vm.Name, "err", err)
				continue
			}
			delete(m.prev, vm.Name)
			if m.asleep != nil {
				m.asleep(vm.Name)
			}
		}
	}
	for name := range m.prev {
		if !seen[name] {
			delete(m.prev, name)
		}
	}
}

// Busy says whether a guest was in use between two samples: a lease, a
// session or forward on the agent, or CPU use above threshold. Without a
// previous sample, CPU use is unknown and does not count.
func Busy(prev, cur Sample, hadPrev bool, threshold float64) bool {
	if cur.Held || cur.Sessions > 0 {
		return true
	}
	if !hadPrev {
		return false
	}
	total := cur.CPUTotal - prev.CPUTotal
	if total <= 0 {
		return false
	}
	busy := cur.CPUBusy - prev.CPUBusy
	if agent := cur.AgentCPU - prev.AgentCPU; agent > 0 && agent <= busy {
		busy -= agent
	}
	return float64(busy)/float64(total) > threshold
}
