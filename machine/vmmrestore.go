package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// restoreSource is what restoreInto restores a VM from, and what it does
// beside.
type restoreSource struct {
	// snapDir is the VMM snapshot (a volume path).
	snapDir storage.Path
	// local, when set and still there once check passed, is a local
	// copy of the snapshot's memory the VMM reads instead of the
	// volume's (memcopy.go).
	local string
	// ram, when set, is the snapshot's memory being staged in a RAM file
	// (stage_ram.go), which the VMM takes if it was made whole, and the
	// VMM prelaunched on it, if any (prelaunch.go).
	ram *stagedRAM
	// stage, when set (and ram is not), starts the staging of the
	// snapshot's memory once the host admitted it (nil: none), which the
	// restore drops when done; from the copy peer names, if any.
	stage func(context.Context, peerCopy) *stagedRAM
	// check, when set, runs while the VMM starts (a verification of the
	// snapshot): the restore goes on only if it passes.
	check func(context.Context) error
	// disks, when set, is waited for before the VMM opens the VM's disk
	// (a clone still under way while the memory is read in).
	disks func() error
	// identity, when set, is the new identity the guest gets in its
	// agent's ready answer (a fork, a create from a warm base).
	identity *agent.IdentityRequest
	// peer, when set, names the local copy of the snapshot's memory on
	// the host that took it (its host from the snapshot's record), which
	// a fill reads before the volume.
	peer peerCopy
}

// restoreInto starts a fresh VMM for vm from the snapshot src names, with
// the VM's own disk and sockets, and waits for its agent; the guest clock
// is set in the agent's ready answer, since it stopped when the snapshot
// was taken, and the new identity, if any, given after it.
func (o *op) restoreInto(ctx context.Context, src restoreSource) (_ *instance, err error) {
	m, vm, sp := o.m, o.vm, o.spec
	local, ram, check, disks := src.local, src.ram, src.check, src.disks
	took, err := m.compat.check(ctx, src.snapDir, vm.VMM)
	if err != nil {
		return nil, err
	}
	peer := src.peer
	if took == m.here.name {
		peer = peerCopy{} // taken here: no other host's copy to read
	} else {
		peer.host = took
	}
	checked := make(chan error, 1)
	if check == nil {
		checked <- nil
	} else {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel() // the check ends with a restore that failed early
		go func() {
			defer phase.Begin(cctx, "verify (beside the vmm's start)")()
			checked <- check(cctx)
		}()
	}
	cfg, err := m.launch.vmmConfig(vm, sp)
	if err != nil {
		return nil, err
	}
	dir, err := m.vol.Path(src.snapDir)
	if err != nil {
		return nil, err
	}
	if err := m.guard.needRAMSpace(vm, ram.allocated()); err != nil {
		return nil, err
	}
	end := phase.Begin(ctx, "admit memory")
	release, err := m.budget.admitMemory(ctx, vm)
	end()
	if err != nil {
		return nil, err
	}
	defer release()
	if ram == nil && src.stage != nil {
		ram = src.stage(ctx, peer)
		defer ram.drop()
	}
	if disks, err = o.diskReady(ctx, disks); err != nil {
		return nil, err
	}
	end = phase.Begin(ctx, "network up")
	err = m.net.up(ctx, vm.Name, sp)
	end()
	if err != nil {
		return nil, err
	}
	end = phase.Begin(ctx, "start vmm")
	hv, opened, err := o.startVMM(ctx, ram, disks)
	end()
	if err != nil {
		return nil, err
	}
	in := newInstance(vm.Name, vm.VMM, hv)
	if !opened.IsZero() {
		in.started = opened // the prelaunched VMM's disk is as old as that
	}
	// A failure from here stops the new VMM before the caller goes on (a
	// wake drops the slot only once it is stopped).
	defer func() {
		if err != nil {
			in.abandon()
			m.launch.discardRuntime(vm.Name)
		}
	}()
	// The VMM fills its RAM while the snapshot is verified, and reads
	// the rest of it once the verification passed; but a verification
	// that may drop the local copy its RAM is read from (and the staging
	// from it) is waited for first: the VMM reads the volume then.
	var verifyErr error
	verifyDone := make(chan struct{}) // closed once verifyErr is set
	verified := sync.OnceValue(func() error {
		defer close(verifyDone)
		defer phase.Begin(ctx, "wait for the verification")()
		verifyErr = <-checked
		return verifyErr
	})
	if local != "" || (ram != nil && ram.local != "") {
		if err := verified(); err != nil {
			return nil, err
		}
		if _, err := os.Stat(local); err != nil {
			local = "" // dropped by the verification
		}
	}
	staged, waitStaged := ram.take()
	from := local // the local copy the RAM is read from, if any
	if staged != "" {
		from = ram.local
	}
	fill := func(dst string) error { return m.snaps.fillMemory(ctx, dir, dst, peer) }
	if staged != "" && ram.local == "" {
		// The staging was this fill: what failed it fails the restore,
		// rather than a second fill from the same sources.
		fill = func(string) error { return waitStaged() }
	}
	end = phase.Begin(ctx, "vmm restore")
	err = hv.Restore(ctx, dir, vmm.RestoreOptions{Resume: true, OnDemand: !m.cfg.RestoreCopy, Config: &cfg, DisksReady: disks,
		LocalMemory: local, StagedMemory: staged, WaitStaged: waitStaged, FillMemory: fill, Verified: verified})
	end()
	select {
	case <-verifyDone:
		if verifyErr != nil {
			return nil, verifyErr // as it is, not as the VMM's restore saw it
		}
	default:
	}
	if err != nil {
		return nil, err
	}
	if err := verified(); err != nil { // a driver that did not wait for it
		return nil, fmt.Errorf("%w: %w", errGuestRan, err)
	}
	// From here the guest runs: a failure is one after it ran.
	if err := o.reconnect(ctx, in, src.identity); err != nil {
		return nil, fmt.Errorf("%w: %w", errGuestRan, err)
	}
	m.snaps.setOrigin(in, src.snapDir, from)
	m.procs.setInstance(in)
	go m.procs.watch(in)
	return in, nil
}

// diskReady is the wait for the VM's disk, which must be on a live
// volume: checked now, or, while it is still being cloned (cloned, if
// set, waits for that), once the clone is over.
func (o *op) diskReady(ctx context.Context, cloned func() error) (func() error, error) {
	waitDisk := func() error {
		defer phase.Begin(ctx, "wait for the volume")()
		return o.m.guard.waitDisk(ctx, o.name())
	}
	if cloned == nil {
		return nil, waitDisk()
	}
	return func() error {
		if err := cloned(); err != nil {
			return err
		}
		return waitDisk()
	}, nil
}

// startVMM starts the VM's VMM, empty, for a restore: the one prelaunched
// on the staged memory, if any, is taken as it is (opened is when it
// opened the VM's disk), else a new one is started in the VM's runtime
// dir and cgroup.
func (o *op) startVMM(ctx context.Context, ram *stagedRAM, disks func() error) (hv vmm.Hypervisor, opened time.Time, err error) {
	m, vm := o.m, o.vm
	rd := m.state.Run(vm.Name)
	m.launch.discardRuntime(vm.Name)
	if hv, opened = ram.prelaunched().take(ctx, vm, disks); hv != nil {
		return hv, opened, nil
	}
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return nil, opened, err
	}
	if err := m.conf.start(vm.Name, vm.CPUs, vm.MemoryBytes); err != nil {
		return nil, opened, err
	}
	if hv, err = m.vmms.newHypervisor(vm.VMM, rd); err != nil {
		return nil, opened, err
	}
	return hv, opened, hv.Start(ctx)
}

// reconnect waits for a restored guest's agent. The guest clock is
// stale: the agent's ready request sets it, and gives the guest its new
// identity, if any.
func (o *op) reconnect(ctx context.Context, in *instance, identity *agent.IdentityRequest) error {
	m := o.m
	opts := []agent.DialOption{agent.WithClockSet()}
	if identity != nil {
		opts = append(opts, agent.WithIdentity(*identity))
	}
	end := phase.Begin(ctx, "agent reconnect")
	info, err := m.agents.connectAgent(ctx, in, time.Minute, opts...)
	end()
	if err != nil {
		return err
	}
	switch {
	case info.ClockError != "":
		return fmt.Errorf("set guest clock: %s", info.ClockError)
	case info.Clock == nil: // an agent older than the clock in its ready request
		end = phase.Begin(ctx, "clock")
		c, err := m.agents.agentClient(ctx, in)
		if err == nil {
			_, err = c.SetClock(ctx, time.Now())
		}
		end()
		if err != nil {
			return fmt.Errorf("set guest clock: %w", err)
		}
	}
	if identity != nil {
		return m.agents.identityAnswered(ctx, in, info, *identity)
	}
	return nil
}

// errGuestRan marks a restore that failed after the restored guest ran.
var errGuestRan = errors.New("the restored guest ran")

// meanwhile runs a volume operation (a disk clone) in the background,
// traced as step (unless "": op traces its own steps), with crash point
// after (if any) once it succeeded, and returns the wait for it: called
// any number of times, it returns the operation's error once it is over.
func meanwhile(ctx context.Context, step, after string, op func() error) func() error {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		end := func() {}
		if step != "" {
			end = phase.Begin(ctx, step)
		}
		err = op()
		end()
		if err == nil && after != "" {
			crashpoint(after)
		}
	}()
	return func() error {
		<-done
		return err
	}
}
