package machine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
)

// prelaunchPrefix names the runtime directory and the cgroup of a VMM
// prelaunched for a restore: _pre-VM-N. No VM name starts with "_"; the
// next start stops and removes any a crash left (sweepPrelaunched).
const prelaunchPrefix = "_pre-"

// prelaunched is a VMM started for a restore while the VM's current VMM
// still runs (vmm.Prelauncher): its process start overlaps the
// verification and the stop of the old VMM instead of following them.
// It maps the restore's staged memory and opens its staged disk, and
// shares the old VMM's TAP; it runs nothing before the restore takes it.
type prelaunched struct {
	m    *Manager
	name string // of its runtime dir and cgroup
	rd   vmm.RunDir
	ram  *stagedRAM
	disk *stagedDisk
	done chan struct{}
	// held is closed once the VMM holds the staged disk open, or will
	// not: only then may the restore rename it over the VM's.
	held     chan struct{}
	holdOnce sync.Once

	hv  vmm.Prelauncher // set once its process answers
	err error
	// opened is when the staged disk was opened for the VMM: the VMM
	// runs on the volume mount of that moment (volumeLost).
	opened time.Time
	taken  bool
	gone   bool
}

// prelaunch starts, in the background, the VMM that a restore of vm
// (spec sp) to a memory checkpoint will take, when vm's driver
// prelaunches and the restore stages both the memory (ram) and the disk
// (disk); nil otherwise. pred is the VM's running instance, nil if none.
func (l *launcher) prelaunch(ctx context.Context, vm registry.VM, sp spec, pred *instance, ram *stagedRAM, disk *stagedDisk) *prelaunched {
	m := l.m
	d, _ := m.drivers[vm.VMM].(vmm.PrelaunchDriver)
	if d == nil || ram == nil || disk == nil {
		return nil
	}
	name := fmt.Sprintf("%s%s-%x", prelaunchPrefix, vm.Name, uint32(time.Now().UnixNano()))
	p := &prelaunched{m: m, name: name, rd: m.state.Run(name), ram: ram, disk: disk, done: make(chan struct{}), held: make(chan struct{})}
	var predHV vmm.Hypervisor
	if pred != nil {
		predHV = pred.hv
	}
	go func() {
		defer close(p.done)
		defer p.hold()
		defer phase.Begin(ctx, "prelaunch the vmm (beside the verification and the stop)")()
		p.err = p.launch(ctx, vm, sp, d, predHV)
		if p.err != nil {
			m.log.Debug("den: prelaunch a vmm for a restore", "vm", vm.Name, "err", p.err)
		}
	}()
	return p
}

// launch starts the VMM once the staged disk is made.
func (p *prelaunched) launch(ctx context.Context, vm registry.VM, sp spec, d vmm.PrelaunchDriver, pred vmm.Hypervisor) error {
	m := p.m
	if err := p.disk.wait(); err != nil {
		return err
	}
	path, err := m.vol.Path(p.disk.path)
	if err != nil {
		return err
	}
	// Held open here, and by the VMM through its own fd (the magic
	// link reopens this very file), the disk may be renamed meanwhile.
	p.opened = time.Now()
	disk, err := os.Open(path)
	p.hold()
	if err != nil {
		return err
	}
	defer disk.Close()
	diskFile := fmt.Sprintf("/proc/self/fd/%d", disk.Fd())
	cfg, err := m.launch.vmmConfig(vm, sp)
	if err != nil {
		return err
	}
	if err := m.net.up(ctx, vm.Name, sp); err != nil {
		return err
	}
	if err := os.MkdirAll(p.rd.Path(), 0o700); err != nil {
		return err
	}
	if err := m.conf.start(p.name, vm.CPUs, vm.MemoryBytes); err != nil {
		return err
	}
	if err := m.vmms.mayStart(); err != nil {
		return err
	}
	hv := d.NewPrelauncher(p.rd, vm.Name)
	if err := hv.Start(ctx); err != nil {
		return err
	}
	if err := hv.Prelaunch(ctx, cfg, vmm.Prelaunch{Memory: p.ram.file(), DiskFiles: []string{diskFile}, Pred: pred}); err != nil {
		return err
	}
	p.hv = hv
	return nil
}

// hold says the staged disk is held open (or will not be).
func (p *prelaunched) hold() { p.holdOnce.Do(func() { close(p.held) }) }

// waitHeld waits until the staged disk may be renamed.
func (p *prelaunched) waitHeld() {
	if p != nil {
		<-p.held
	}
}

// take hands the prelaunched VMM over as vm's, once vm's old VMM is gone
// and its runtime files discarded: in vm's runtime dir and cgroup. It
// waits for the VMM and for disks (the staged disk put in place, and
// the volume), and returns it with the time it opened its disk (the
// instance's start, for the volume-loss check); nil, having dropped it,
// when there is none to take: it failed, the staged memory or disk was
// not used after all, or the volume's mount was lost since it opened
// its disk (the restore then starts a VMM as usual, on the live mount).
func (p *prelaunched) take(ctx context.Context, vm registry.VM, disks func() error) (vmm.Hypervisor, time.Time) {
	if p == nil {
		return nil, time.Time{}
	}
	defer phase.Begin(ctx, "take the prelaunched vmm")()
	<-p.done
	if p.err != nil || p.hv == nil {
		p.drop()
		return nil, time.Time{}
	}
	staged, _ := p.ram.take()
	if staged != p.ram.file() || (disks != nil && disks() != nil) || !p.disk.used || p.m.procs.volumeLostSince(p.opened) {
		p.drop()
		return nil, time.Time{}
	}
	m := p.m
	rd := m.state.Run(vm.Name)
	_ = os.RemoveAll(rd.Path())
	if err := p.hv.MoveRunDir(rd); err != nil {
		m.log.Warn("den: take a prelaunched vmm", "vm", vm.Name, "err", err)
		p.drop()
		return nil, time.Time{}
	}
	p.rd = rd
	if err := m.conf.start(vm.Name, vm.CPUs, vm.MemoryBytes); err != nil {
		m.log.Warn("den: take a prelaunched vmm", "vm", vm.Name, "err", err)
		p.drop()
		return nil, time.Time{}
	}
	m.conf.move(p.name, vm.Name)
	p.taken = true
	return p.hv, p.opened
}

// drop stops a prelaunched VMM nobody took and removes its runtime dir
// and cgroup; it may be called any number of times.
func (p *prelaunched) drop() {
	if p == nil {
		return
	}
	<-p.done
	if p.taken || p.gone {
		return
	}
	p.gone = true
	if p.hv != nil {
		_ = p.hv.Discard(context.Background())
	} else {
		stopPIDFile(p.rd)
	}
	_ = os.RemoveAll(p.rd.Path())
	p.m.conf.drop(p.name)
}

// stopPIDFile stops the VMM process rd's PID file names, if it runs.
func stopPIDFile(rd vmm.RunDir) {
	if proc, err := vmm.AdoptProcess(rd.PIDFile()); err == nil {
		_ = proc.Stop(3 * time.Second)
	}
}

// sweepPrelaunched stops and removes the VMMs a crash left prelaunched,
// at start.
func (su *startup) sweepPrelaunched() {
	ents, _ := os.ReadDir(su.m.state.Runs())
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prelaunchPrefix) {
			continue
		}
		rd := su.m.state.Run(e.Name())
		su.m.log.Warn("den: stopping a vmm left prelaunched by an interrupted restore", "dir", rd.Path())
		stopPIDFile(rd)
		_ = os.RemoveAll(rd.Path())
		su.m.conf.drop(e.Name())
	}
}
