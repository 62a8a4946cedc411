package machine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
)

// Session is a claim on a running VM's agent connection: the VM counts as
// active, and cannot be put to sleep or restored from under it, until
// Release.
type Session struct {
	// Conn opens channels on the agent (sshrelay.Opener).
	Conn ssh.Conn
	// Done is closed when the agent connection breaks (the VM stopped).
	Done <-chan struct{}
	in   *instance // nil: a remote session
	m    *Manager
	done bool
	// release ends a remote session.
	release func()
}

// RemoteSession is a session on a VM that another host of a cluster
// runs, reached through that host, which admits and records it: conn
// opens channels there, done is closed when it breaks, release ends it.
func RemoteSession(conn ssh.Conn, done <-chan struct{}, release func()) *Session {
	return &Session{Conn: conn, Done: done, release: release}
}

// Tag gives the session an id in the VM's activity record, marked there
// with who opened it and through what: every command it runs, and their
// descendants, carry the id in the record. It returns the id.
func (s *Session) Tag(who, via string) string {
	if s.in == nil {
		return "" // the host that runs the VM tags it
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := via + "-" + hex.EncodeToString(b[:])
	s.m.records.markLazy(s.in.name, activity.Entry{Kind: activity.KindSession, Session: id, Who: who, Via: via})
	s.Conn = taggedConn{Conn: s.Conn, id: id}
	return id
}

// NoteURL marks, in the VM's activity record, a request through the
// VM's URL to port that this session serves; requests close together
// share an entry.
func (s *Session) NoteURL(port int) {
	if s.in == nil {
		return
	}
	s.m.records.noteURL(s.in.name, port)
}

// taggedConn opens session channels that carry their den session's id
// (agent.EnvSession) before anything else.
type taggedConn struct {
	ssh.Conn
	id string
}

func (c taggedConn) OpenChannel(name string, data []byte) (ssh.Channel, <-chan *ssh.Request, error) {
	ch, reqs, err := c.Conn.OpenChannel(name, data)
	if err != nil || name != "session" {
		return ch, reqs, err
	}
	msg := struct{ Name, Value string }{agent.EnvSession, c.id}
	if _, err := ch.SendRequest("env", false, ssh.Marshal(&msg)); err != nil {
		ch.Close()
		return nil, nil, err
	}
	return ch, reqs, nil
}

// Release ends the session's claim on the VM.
func (s *Session) Release() {
	if s.done {
		return
	}
	s.done = true
	if s.in == nil {
		s.release()
		return
	}
	s.in.release()
}

// Open returns a session on the VM's agent, starting or waking the VM
// first if it is not running, and waiting for it. owner, when set, must
// own the VM. The session is admitted under the same rule as a sleep: a
// sleep either finished before (and the VM is woken) or does not start
// while the session is open.
func (m *Manager) Open(ctx context.Context, name, owner string) (*Session, error) {
	in, err := m.ensureRunning(ctx, name, owner, true, false)
	if err != nil {
		return nil, err
	}
	s := &Session{in: in, m: m}
	c, err := m.agents.agentClient(ctx, in)
	if err != nil {
		s.Release()
		return nil, fmt.Errorf("vm %q: %w", name, err)
	}
	s.Conn, s.Done = c.SSH(), c.Done()
	return s, nil
}

// ensureRunning returns the running instance of a VM, booting a stopped
// VM or waking a sleeping one first (a lost one only with boot: a person
// asked for it); with admit, a session is counted on it before any sleep
// can close it.
func (m *Manager) ensureRunning(ctx context.Context, name, owner string, admit, boot bool) (*instance, error) {
	if err := m.host.hostRefuses(name); err != nil {
		return nil, err
	}
	vm, err := m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	if owner != "" && vm.Owner != owner {
		return nil, fmt.Errorf("no vm named %q: %w", name, ErrNotFound)
	}
	// The fast path: running, and not being closed by a sleep, restore
	// or rm (which hold the lock; the slow path waits for them).
	if in := m.procs.instance(name); in != nil && alive(in) && ((admit && in.admit()) || (!admit && in.isOpen())) {
		return in, nil
	}
	o, err := m.begin(ctx, name, "wake")
	if err != nil {
		return nil, err
	}
	defer o.unlock()
	o.bootLost = boot
	in, err := o.run(ctx)
	o.finish(err)
	if err != nil {
		return nil, err
	}
	// A wake under way when a host shutdown began finishes, and the
	// shutdown puts the VM back to sleep: no session starts on it.
	if err := m.host.hostRefuses(name); err != nil {
		return nil, err
	}
	if admit && !in.admit() {
		return nil, fmt.Errorf("vm %q: session not admitted: %w", name, ErrConflict)
	}
	return in, nil
}

// run returns the running instance of the VM, booting it when it is
// stopped or waking it when it sleeps.
func (o *op) run(ctx context.Context) (*instance, error) {
	in := o.instance()
	if in == nil || !alive(in) {
		done, err := o.m.wakeSlot(ctx, o.name())
		if err != nil {
			return nil, err
		}
		defer done()
		switch o.vm.State {
		case registry.StateLost:
			if !o.bootLost {
				return nil, fmt.Errorf("vm %q is lost (%s): it waits for a person: den wake %s boots it from its disk, den restore %s CHECKPOINT restores a checkpoint: %w",
					o.name(), o.vm.Reason, o.name(), o.name(), ErrConflict)
			}
			fallthrough
		case registry.StateStopped:
			restoring := o.spec.Restoring != ""
			if err := o.start(ctx); err != nil {
				return nil, err
			}
			if !restoring { // a restore marks itself
				o.m.records.mark(o.name(), vmEvent(activity.EventBoot, "", "booted from its disk"))
			}
		case registry.StateSleeping:
			if err := o.wake(ctx); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("vm %q is %s: %w", o.name(), o.vm.State, ErrConflict)
		}
		if in = o.instance(); in == nil {
			return nil, fmt.Errorf("vm %q did not start", o.name())
		}
	}
	// No operation holds the VM now but this one: a closing flag left
	// by an operation that failed half-way is stale, and a VM just
	// started is committed.
	in.reopen()
	return in, nil
}

// start cold-boots a stopped VM from its disk (or finishes the restore a
// crash interrupted).
func (o *op) start(ctx context.Context) error {
	m, vm := o.m, o.vm
	if id := o.spec.Restoring; id != "" {
		cp, err := m.getCheckpoint(ctx, vm.Name, id)
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("finish the interrupted restore of vm %q: its checkpoint %s is gone: %w", vm.Name, id, ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("finish the interrupted restore of vm %q: %w", vm.Name, err)
		}
		return o.finishRestore(ctx, cp, nil, nil, func(string) {})
	}
	if err := m.launch.boot(ctx, vm, o.spec); err != nil {
		return fmt.Errorf("start vm %q: %w", vm.Name, err)
	}
	if err := o.commitRunning(ctx, nil); err != nil {
		return fmt.Errorf("start vm %q: %w", vm.Name, err)
	}
	return nil
}

// wakeSlot waits (at most Config.WakeWait) for one of the host's
// Config.MaxWakes slots for a wake, boot or restore, and returns its
// release: a storm of wakes (a lost host's VMs, all asked for at once)
// takes its turns instead of starting every VMM at once.
func (m *Manager) wakeSlot(ctx context.Context, name string) (func(), error) {
	select {
	case m.wakes <- struct{}{}:
		return func() { <-m.wakes }, nil
	default:
	}
	t := time.NewTimer(m.cfg.WakeWait)
	defer t.Stop()
	defer phase.Begin(ctx, "wait for a wake slot")()
	select {
	case m.wakes <- struct{}{}:
		return func() { <-m.wakes }, nil
	case <-t.C:
		return nil, fmt.Errorf("vm %q: host %q is waking %d vms, its bound, and none finished within %s: try again: %w",
			name, m.here.name, m.cfg.MaxWakes, m.cfg.WakeWait, ErrBusy)
	case <-ctx.Done():
		return nil, fmt.Errorf("vm %q: waiting for one of host %q's %d wake slots: %w", name, m.here.name, m.cfg.MaxWakes, errors.Join(ErrBusy, ctx.Err()))
	}
}
