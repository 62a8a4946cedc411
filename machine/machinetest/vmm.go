//go:build linux

// Package machinetest gives tests of den's orchestration a VMM and a
// storage volume that need neither images nor root: a fake VMM process
// that runs the real guest agent in-process, and a volume that is a plain
// directory.
package machinetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/agent/guest"
	"github.com/denhq/den/vmm"
)

// Name is the fake driver's VMM name.
const Name = "fake"

// Driver is a fake VMM: its "processes" live in this test process, keyed
// by runtime directory, so that a second Manager (a daemon restart)
// adopts them. Each running VM serves the real guest agent (SSH, control
// requests) on a unix socket, with a fake System.
type Driver struct {
	mu    sync.Mutex
	vms   map[string]*VMM // by runtime dir
	boots atomic.Int64
	pids  atomic.Int64
	// Hook, when set, is called at the start of every VMM call with its
	// name ("pause", "snapshot", ...): tests widen race windows with it.
	Hook func(op, rundir string)
	// LazyRestore makes the fake say that its restores map memory
	// lazily (vmm.Capabilities.OnDemandRestore); set it before a
	// Manager uses the driver.
	LazyRestore bool
	log         *slog.Logger
	version     atomic.Value // string: the fake binary's version
}

// NewDriver returns a fake VMM driver.
func NewDriver() *Driver {
	d := &Driver{vms: map[string]*VMM{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	d.pids.Store(100000)
	return d
}

var _ vmm.Driver = (*Driver)(nil)

// SetVersion makes the fake's binary another version ("0" at first),
// whose snapshots the other versions' cannot restore: as an upgraded
// VMM, or another host's, would be.
func (d *Driver) SetVersion(v string) { d.version.Store(v) }

// Capabilities implements vmm.Driver.
func (d *Driver) Capabilities() vmm.Capabilities {
	ver, _ := d.version.Load().(string)
	if ver == "" {
		ver = "0"
	}
	return vmm.Capabilities{Name: Name, Version: ver, SnapshotVersion: ver, Accelerator: "fake", Pause: true, Snapshot: true,
		OnDemandRestore: d.LazyRestore, GuestChannel: vmm.ChannelVsock, MultiConn: true, ResizeDisk: true,
		Kernel: vmm.KernelVmlinux, Network: "none (fake vmm)"}
}

// New implements vmm.Driver.
func (d *Driver) New(rd vmm.RunDir) vmm.Hypervisor { return d.newVMM(rd) }

// Adopt implements vmm.Driver.
func (d *Driver) Adopt(ctx context.Context, rd vmm.RunDir) (vmm.Hypervisor, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[rd.Path()]
	if !ok || !v.alive() {
		return nil, fmt.Errorf("adopt %s: no vmm answers: %w", rd.Path(), vmm.ErrNotRunning)
	}
	return v, nil
}

// Boots counts cold boots (Boot calls) since the driver was made.
func (d *Driver) Boots() int64 { return d.boots.Load() }

// VM returns the live fake VMM of a runtime dir, or nil.
func (d *Driver) VM(rd vmm.RunDir) *VMM {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.vms[rd.Path()]
	if v == nil || !v.alive() {
		return nil
	}
	return v
}

// Live is the number of fake VMM processes alive.
func (d *Driver) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, v := range d.vms {
		if v.alive() {
			n++
		}
	}
	return n
}

func (d *Driver) newVMM(rd vmm.RunDir) *VMM {
	return &VMM{d: d, rd: rd, exited: make(chan struct{}), state: vmm.StateNotCreated}
}

// VMM is one fake VMM process.
type VMM struct {
	d  *Driver
	rd vmm.RunDir

	mu      sync.Mutex
	pid     int
	state   vmm.State
	cfg     vmm.Config
	memory  string // what "guest RAM" holds: a boot id, kept by snapshots
	disks   map[string]int64
	started bool
	exited  chan struct{}
	exitErr error
	ln      net.Listener
	srv     *guest.Server
	etc     string
}

var _ vmm.Hypervisor = (*VMM)(nil)

// Memory is the VM's "RAM": a boot id made at Boot and carried by
// snapshots and restores. A cold boot changes it.
func (v *VMM) Memory() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.memory
}

// Etc is the fake guest's /etc (hostname, machine-id).
func (v *VMM) Etc() string { return v.etc }

func (v *VMM) alive() bool {
	select {
	case <-v.exited:
		return false
	default:
		return v.started
	}
}

func (v *VMM) hook(op string) error {
	if h := v.d.Hook; h != nil {
		h(op, v.rd.Path())
	}
	select {
	case <-v.exited:
		return fmt.Errorf("%s: %w", op, vmm.ErrNotRunning)
	default:
	}
	return nil
}

// Capabilities of the fake: its driver's.
func (v *VMM) Capabilities() vmm.Capabilities { return v.d.Capabilities() }

// Start starts the fake process.
func (v *VMM) Start(ctx context.Context) error {
	if err := os.MkdirAll(v.rd.Path(), 0o700); err != nil {
		return err
	}
	v.mu.Lock()
	v.started = true
	v.pid = int(v.d.pids.Add(1))
	v.mu.Unlock()
	v.d.mu.Lock()
	v.d.vms[v.rd.Path()] = v
	v.d.mu.Unlock()
	return nil
}

// Create defines the VM.
func (v *VMM) Create(ctx context.Context, cfg vmm.Config) error {
	if err := v.hook("create"); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := vmm.CheckTransition("create", v.state); err != nil {
		return err
	}
	v.cfg, v.state = cfg, vmm.StateCreated
	return nil
}

// Boot runs the VM: new memory, and the agent serving.
func (v *VMM) Boot(ctx context.Context) error {
	if err := v.hook("boot"); err != nil {
		return err
	}
	v.d.boots.Add(1)
	v.mu.Lock()
	if err := vmm.CheckTransition("boot", v.state); err != nil {
		v.mu.Unlock()
		return err
	}
	v.memory = fmt.Sprintf("boot-%d-%d", v.pid, time.Now().UnixNano())
	v.mu.Unlock()
	return v.run(vmm.StateRunning)
}

// run starts the in-process guest agent and sets the state.
func (v *VMM) run(state vmm.State) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.etc = filepath.Join(v.rd.Path(), "guest-etc")
	if err := os.MkdirAll(filepath.Join(v.etc, "den"), 0o700); err != nil {
		return err
	}
	_, key, err := agent.NewEd25519Key("fake-agent")
	if err != nil {
		return err
	}
	cmd := guest.ParseCmdline(v.cfg.Cmdline)
	sys := &guest.System{
		SetClock:    func(time.Time) error { return nil },
		Freezer:     nopFreezer{},
		SetHostname: func(string) error { return nil },
		Reseed:      func([]byte) error { return nil },
		EtcDir:      v.etc,
		ProcDir:     filepath.Join(v.rd.Path(), "guest-proc"),
	}
	srv, err := guest.New(guest.Config{HostKey: key, AuthorizedKeys: guest.AuthorizedKeys("", cmd.Keys, v.d.log),
		System: sys, Logger: v.d.log})
	if err != nil {
		return err
	}
	sock := filepath.Join(v.rd.Path(), "fake-agent.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	v.ln, v.srv, v.state = ln, srv, state
	go func() { _ = srv.Serve(ln) }()
	return nil
}

type nopFreezer struct{}

func (nopFreezer) Mounts() ([]string, error) { return []string{"/"}, nil }
func (nopFreezer) Freeze(string) error       { return nil }
func (nopFreezer) Thaw(string) error         { return nil }

// Pause stops the vCPUs.
func (v *VMM) Pause(ctx context.Context) error { return v.transition("pause", vmm.StatePaused) }

// Resume runs them again.
func (v *VMM) Resume(ctx context.Context) error { return v.transition("resume", vmm.StateRunning) }

func (v *VMM) transition(op string, to vmm.State) error {
	if err := v.hook(op); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := vmm.CheckTransition(op, v.state); err != nil {
		return err
	}
	v.state = to
	return nil
}

type snapshot struct {
	Config vmm.Config `json:"config"`
	Memory string     `json:"memory"`
}

// Snapshot writes the config and "memory" into dir.
func (v *VMM) Snapshot(ctx context.Context, dir string) error {
	if err := v.hook("snapshot"); err != nil {
		return err
	}
	v.mu.Lock()
	if err := vmm.CheckTransition("snapshot", v.state); err != nil {
		v.mu.Unlock()
		return err
	}
	data, _ := json.Marshal(snapshot{Config: v.cfg, Memory: v.memory})
	v.mu.Unlock()
	if err := writeRAM(filepath.Join(dir, RAMFile), v.memory); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "fake-snapshot.json"), data, 0o600)
}

// RAMFile is the fake snapshot's guest RAM: RAMSize bytes, sparse, with
// the guest's memory string at every MiB, as large as a real snapshot's
// memory is against den's digests (many extents).
const (
	RAMFile = "fake-ram"
	RAMSize = 64 << 20
)

func writeRAM(path, memory string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(RAMSize); err != nil {
		return err
	}
	for off := int64(0); off < RAMSize; off += 1 << 20 {
		if _, err := f.WriteAt([]byte("ram:"+memory), off); err != nil {
			return err
		}
	}
	return f.Sync()
}

// Restore loads a snapshot into this fresh VMM.
func (v *VMM) Restore(ctx context.Context, dir string, opts vmm.RestoreOptions) error {
	if err := v.hook("restore"); err != nil {
		return err
	}
	if err := opts.WaitVerified(); err != nil { // as a real VMM before it reads the snapshot's state
		return fmt.Errorf("restore: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "fake-snapshot.json"))
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	var s snapshot
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := opts.WaitDisks(); err != nil { // as a real VMM opens its disks
		return fmt.Errorf("restore: %w", err)
	}
	v.mu.Lock()
	if err := vmm.CheckTransition("restore", v.state); err != nil {
		v.mu.Unlock()
		return err
	}
	v.cfg, v.memory = s.Config, s.Memory
	if opts.Config != nil {
		v.cfg = *opts.Config
	}
	v.mu.Unlock()
	state := vmm.StatePaused
	if opts.Resume {
		state = vmm.StateRunning
	}
	return v.run(state)
}

// Info reports the state.
func (v *VMM) Info(ctx context.Context) (vmm.Info, error) {
	if err := v.hook("info"); err != nil {
		return vmm.Info{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return vmm.Info{State: v.state, PID: v.pid, CPUs: v.cfg.CPUs, MemoryBytes: v.cfg.MemoryBytes}, nil
}

// ResizeDisk records a disk's new size.
func (v *VMM) ResizeDisk(ctx context.Context, id string, bytes int64) error {
	if err := v.hook("resize-disk"); err != nil {
		return err
	}
	for _, d := range v.cfg.Disks {
		if d.ID == id {
			return os.Truncate(d.Path, bytes)
		}
	}
	return fmt.Errorf("resize disk %q: no such disk", id)
}

// Shutdown stops the process (hook "shutdown").
func (v *VMM) Shutdown(ctx context.Context) error {
	v.stopHook("shutdown")
	v.exit(nil)
	return nil
}

// Discard stops the process as den's SIGKILL would (hook "discard").
func (v *VMM) Discard(ctx context.Context) error {
	v.stopHook("discard")
	v.exit(errors.New("signal: killed"))
	return nil
}

// stopHook tells the hook of a stop of a live process.
func (v *VMM) stopHook(op string) {
	if h := v.d.Hook; h != nil && v.alive() {
		h(op, v.rd.Path())
	}
}

// Kill makes the process die as if killed (-9): den did not ask.
func (v *VMM) Kill() { v.exit(errors.New("signal: killed")) }

// Config is the config the VM was created or restored with.
func (v *VMM) Config() vmm.Config {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cfg
}

func (v *VMM) exit(err error) {
	v.mu.Lock()
	select {
	case <-v.exited:
		v.mu.Unlock()
		return
	default:
	}
	v.exitErr = err
	v.state = vmm.StateShutdown
	if v.srv != nil {
		_ = v.srv.Close()
	}
	if v.ln != nil {
		_ = v.ln.Close()
	}
	close(v.exited)
	v.mu.Unlock()
}

// DialGuest connects to the in-process agent.
func (v *VMM) DialGuest(ctx context.Context, port uint32) (net.Conn, error) {
	if err := v.hook("dial"); err != nil {
		return nil, err
	}
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", filepath.Join(v.rd.Path(), "fake-agent.sock"))
}

// Exited is closed when the process has exited.
func (v *VMM) Exited() <-chan struct{} { return v.exited }

// ExitErr says how it exited.
func (v *VMM) ExitErr() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.exitErr
}

// PID is a made-up process id.
func (v *VMM) PID() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.pid
}
