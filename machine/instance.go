package machine

import (
	"context"
	"sync"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/vmm"
)

// instance is the live side of a VM that has a VMM process.
type instance struct {
	name     string
	vmm      string // the VM's VMM, as its record names it
	hv       vmm.Hypervisor
	stopping chan struct{} // closed when den itself stops the VMM
	started  time.Time     // when den started or adopted the VMM (a prelaunched one: opened its disk)

	dialMu  sync.Mutex // serialises redials of the agent
	agentMu sync.Mutex
	agent   *agent.Client

	// actMu guards the session count and the closing flag together: a
	// session is admitted and a VMM is closed (sleep, restore, rm) under
	// the same rule, so one of them happens first, never both.
	actMu    sync.Mutex
	sessions int
	closing  bool
	lastAct  time.Time
	savedAct time.Time // the last activity recorded in the registry (activity.go)

	origin originBox // the snapshot its RAM last equalled (delta.go)
}

// newInstance is a VMM just started or adopted: closed to sessions until
// the operation that made it commits the VM's record as running and calls
// reopen (a session must never see a VM that is not yet, or no longer,
// the one its record says).
func newInstance(name, vmmName string, hv vmm.Hypervisor) *instance {
	now := time.Now()
	// The operation that made it records now as the VM's last activity.
	return &instance{name: name, vmm: vmmName, hv: hv, stopping: make(chan struct{}), started: now, lastAct: now, savedAct: now, closing: true}
}

// isOpen says whether sessions are admitted (the VM is committed running
// and nothing is closing it).
func (in *instance) isOpen() bool {
	in.actMu.Lock()
	defer in.actMu.Unlock()
	return !in.closing
}

// admit counts a new session unless the VMM is being closed; the caller
// then waits for the VM's lock and finds the VM asleep or stopped.
func (in *instance) admit() bool {
	in.actMu.Lock()
	defer in.actMu.Unlock()
	if in.closing {
		return false
	}
	in.sessions++
	in.lastAct = time.Now()
	return true
}

// release ends a session.
func (in *instance) release() {
	in.actMu.Lock()
	in.sessions--
	in.lastAct = time.Now()
	in.actMu.Unlock()
}

// close marks the VMM as closing so that no session is admitted any
// more; it refuses (returning the count) while sessions are open, unless
// force. The caller holds the VM's lock and calls reopen if it does not
// stop the VMM after all.
func (in *instance) close(force bool) (open int, ok bool) {
	in.actMu.Lock()
	defer in.actMu.Unlock()
	if in.sessions > 0 && !force {
		return in.sessions, false
	}
	in.closing = true
	return in.sessions, true
}

// sessionGrace is how long a sleep or a restore waits for sessions that
// are ending (an ssh client that just exited: the gateway closes its
// session a moment later) before it refuses for open sessions.
const sessionGrace = 2 * time.Second

// closeWithin is close, waiting up to grace for the sessions to end.
func (in *instance) closeWithin(force bool, grace time.Duration) (open int, ok bool) {
	deadline := time.Now().Add(grace)
	for {
		if open, ok = in.close(force); ok || time.Now().After(deadline) {
			return open, ok
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reopen admits sessions again after a close that did not stop the VMM.
func (in *instance) reopen() {
	in.actMu.Lock()
	in.closing = false
	in.actMu.Unlock()
}

// activity is the session count and the time of the last activity.
func (in *instance) activity() (int, time.Time) {
	in.actMu.Lock()
	defer in.actMu.Unlock()
	return in.sessions, in.lastAct
}

// adopted sets the last activity of a VMM found running at start to the
// one the registry recorded: adopting it is no activity.
func (in *instance) adopted(last time.Time) {
	if last.IsZero() {
		return
	}
	in.actMu.Lock()
	defer in.actMu.Unlock()
	in.lastAct, in.savedAct = last, last
}

// unsaved is the last activity to record (now while a session is open)
// if it is newer than what the registry holds.
func (in *instance) unsaved(now time.Time) (time.Time, bool) {
	in.actMu.Lock()
	defer in.actMu.Unlock()
	t := in.lastAct
	if in.sessions > 0 {
		t = now
	}
	return t, t.After(in.savedAct)
}

// abandon stops the VMM of an instance that never ran as its VM's (a
// boot or a restore failed before it was set): no session was admitted,
// nothing watches it.
func (in *instance) abandon() {
	close(in.stopping)
	in.closeAgent()
	_ = in.hv.Shutdown(context.Background())
}

// saved notes that the registry holds t as the last activity.
func (in *instance) saved(t time.Time) {
	in.actMu.Lock()
	defer in.actMu.Unlock()
	if t.After(in.savedAct) {
		in.savedAct = t
	}
}

func (in *instance) closeAgent() {
	in.agentMu.Lock()
	defer in.agentMu.Unlock()
	if in.agent != nil {
		in.agent.Close()
		in.agent = nil
	}
}

func alive(in *instance) bool {
	select {
	case <-in.hv.Exited():
		return false
	default:
		return true
	}
}

func (pr *procs) instance(name string) *instance {
	pr.m.mu.Lock()
	defer pr.m.mu.Unlock()
	return pr.m.instances[name]
}

// setInstance publishes a VM's VMM. One that opened its disk before the
// volume was last lost is stopped as soon as its operation lets go.
func (pr *procs) setInstance(in *instance) {
	pr.m.mu.Lock()
	defer pr.m.mu.Unlock()
	pr.m.instances[in.name] = in
	if in.started.Before(pr.m.volumeLostAt) {
		go pr.m.guard.stopLost(in, pr.m.volumeLostWhy)
	}
}

// volumeLostSince says whether the volume's mount was lost after t: a
// VMM that opened its disk at t holds it on the dead mount.
func (pr *procs) volumeLostSince(t time.Time) bool {
	pr.m.mu.Lock()
	defer pr.m.mu.Unlock()
	return t.Before(pr.m.volumeLostAt)
}

func (pr *procs) dropInstance(name string) {
	pr.m.mu.Lock()
	defer pr.m.mu.Unlock()
	delete(pr.m.instances, name)
}

// dropInstanceIf forgets in unless another instance replaced it.
func (pr *procs) dropInstanceIf(in *instance) {
	pr.m.mu.Lock()
	defer pr.m.mu.Unlock()
	if pr.m.instances[in.name] == in {
		delete(pr.m.instances, in.name)
	}
}

// procs are the VMs' running VMM processes (instances): who runs, watched
// until they exit, stopped, recorded stopped (instance.go, reconcile.go).
type procs struct{ m *Manager }
