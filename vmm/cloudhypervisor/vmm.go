package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/denhq/den/vmm"
)

var _ vmm.Hypervisor = (*VMM)(nil)

// Options configures a VMM.
type Options struct {
	// Binary is the cloud-hypervisor executable (see FindBinary).
	Binary string
	// RunDir holds the VMM's sockets, PID file and logs.
	RunDir vmm.RunDir
	// Logger receives the driver's own events; nil discards them.
	Logger *slog.Logger
	// Verbosity adds that many -v flags to cloud-hypervisor (0: warnings
	// and errors only, which keeps a long-lived VM's log small).
	Verbosity int
	// StopGrace is how long Shutdown waits for the process to exit after
	// asking it to, then again after SIGTERM before SIGKILL (default 3 s).
	StopGrace time.Duration
	// GuestDialTimeout bounds DialGuest's wait for the OK to CONNECT
	// (default 3 s; a shorter context deadline wins).
	GuestDialTimeout time.Duration
	// Confine is the user the VMM runs as and the cgroup it starts in;
	// that user gets the run dir. Seccomp stays on (the VMM's default).
	Confine vmm.Confine
	// Landlock confines the VMM, once its VM is made, to the paths its
	// config names, the run dir, and LandlockRules (the directories
	// snapshots are written to, for one).
	Landlock      bool
	LandlockRules []LandlockConfig
}

const (
	defaultStopGrace        = 3 * time.Second
	defaultGuestDialTimeout = 3 * time.Second
	// logTailBytes is how much of the VMM log an error quotes.
	logTailBytes = 600
	// maxSocketPath keeps socket paths under the kernel's 108-byte limit,
	// with room for the "_<port>" suffix Cloud Hypervisor adds to the
	// vsock socket for guest-initiated connections.
	maxSocketPath = 100
)

// VMM drives one cloud-hypervisor process. Its methods are safe for
// concurrent use.
type VMM struct {
	opts   Options
	log    *slog.Logger
	client *apiClient

	mu      sync.Mutex
	proc    *vmm.Process
	version string // build_version from vmm.ping
	logFrom int64  // size of the log when the process started
}

// New returns a driver for the VMM of opts.RunDir. It starts nothing:
// call Start for a new process, or use Adopt for a running one.
func New(opts Options) *VMM {
	if opts.StopGrace <= 0 {
		opts.StopGrace = defaultStopGrace
	}
	if opts.GuestDialTimeout <= 0 {
		opts.GuestDialTimeout = defaultGuestDialTimeout
	}
	l := opts.Logger
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &VMM{
		opts:   opts,
		log:    l.With("vmm", "cloud-hypervisor", "run_dir", opts.RunDir.Path()),
		client: newAPIClient(opts.RunDir.APISocket()),
	}
}

func (v *VMM) process() *vmm.Process {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.proc
}

func (v *VMM) cachedVersion() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.version
}

// call sends one API request with a deadline (vmm.DefaultCallTimeout when
// ctx has none) and turns a VMM that died or is absent into an error
// wrapping vmm.ErrNotRunning that quotes the log.
func (v *VMM) call(ctx context.Context, method, endpoint string, in, out any) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	op := opName(endpoint)
	p := v.process()
	if p != nil && !p.Alive() {
		return fmt.Errorf("ch %s: %w (%v)%s", op, vmm.ErrNotRunning, p.Err(), v.logNote())
	}
	err := v.client.do(ctx, method, endpoint, in, out)
	if err == nil {
		return nil
	}
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr
	}
	if p != nil {
		// A connection cut mid-call usually means the process died: give
		// the exit a moment to be noticed.
		if ctx.Err() == nil {
			select {
			case <-p.Exited():
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		}
		if !p.Alive() {
			return fmt.Errorf("ch %s: vmm process exited during the call (%v; %v)%s: %w",
				op, err, p.Err(), v.logNote(), vmm.ErrNotRunning)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("ch %s: no answer from %s: %w", op, v.opts.RunDir.APISocket(), ctx.Err())
	}
	if p != nil {
		return fmt.Errorf("ch %s: %w", op, err)
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("ch %s: nothing answers on %s (%v)%s: %w", op, v.opts.RunDir.APISocket(), err, v.logNote(), vmm.ErrNotRunning)
	}
	return fmt.Errorf("ch %s: %w", op, err)
}

// Ping asks the VMM for its version; it also refreshes Capabilities().Version.
func (v *VMM) Ping(ctx context.Context) (VmmPingResponse, error) {
	var r VmmPingResponse
	if err := v.call(ctx, http.MethodGet, "vmm.ping", nil, &r); err != nil {
		return r, err
	}
	v.setVersion(r)
	return r, nil
}

// setVersion remembers the release the VMM reports (build_version, else
// the API version).
func (v *VMM) setVersion(r VmmPingResponse) {
	ver := r.BuildVersion
	if ver == "" {
		ver = r.Version
	}
	v.mu.Lock()
	v.version = ver
	v.mu.Unlock()
}

// Create defines the VM (vm.create) from cfg and records cfg in the run
// directory's config file.
func (v *VMM) Create(ctx context.Context, cfg vmm.Config) error {
	body, err := v.vmConfig(cfg)
	if err != nil {
		return fmt.Errorf("ch create: %w", err)
	}
	if err := v.grantDisks(cfg.Disks); err != nil {
		return fmt.Errorf("ch create: %w", err)
	}
	removeStaleSocket(v.opts.RunDir.VsockSocket())
	if err := v.call(ctx, http.MethodPut, "vm.create", body, nil); err != nil {
		return err
	}
	v.saveConfig(cfg)
	return nil
}

// grantDisks gives the VMM's user (Options.Confine) the VM's disks:
// Cloud Hypervisor opens them by path. Landlock keeps it from any other
// VM's files the same user owns.
func (v *VMM) grantDisks(disks []vmm.Disk) error {
	u := v.opts.Confine.User
	if u == nil {
		return nil
	}
	for _, d := range disks {
		if err := u.Own(d.Path); err != nil {
			return err
		}
	}
	return nil
}

// Boot runs the created VM (vm.boot).
func (v *VMM) Boot(ctx context.Context) error {
	return v.call(ctx, http.MethodPut, "vm.boot", nil, nil)
}

// Pause stops the vCPUs (vm.pause).
func (v *VMM) Pause(ctx context.Context) error {
	return v.call(ctx, http.MethodPut, "vm.pause", nil, nil)
}

// Resume runs a paused VM's vCPUs again (vm.resume).
func (v *VMM) Resume(ctx context.Context) error {
	return v.call(ctx, http.MethodPut, "vm.resume", nil, nil)
}

// VMInfo returns vm.info as Cloud Hypervisor sends it; a VMM without a VM
// answers with an *APIError whose NotCreated is true.
func (v *VMM) VMInfo(ctx context.Context) (VmInfo, error) {
	var info VmInfo
	err := v.call(ctx, http.MethodGet, "vm.info", nil, &info)
	return info, err
}

// Info reports the VM's state; a VMM without a VM is StateNotCreated.
func (v *VMM) Info(ctx context.Context) (vmm.Info, error) {
	out := vmm.Info{PID: v.PID(), Version: v.cachedVersion()}
	info, err := v.VMInfo(ctx)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.NotCreated() {
		out.State = vmm.StateNotCreated
		return out, nil
	}
	if err != nil {
		return out, err
	}
	out.State = vmm.State(info.State)
	out.MemoryBytes = info.MemoryActualSize
	if out.MemoryBytes == 0 && info.Config.Memory != nil {
		out.MemoryBytes = info.Config.Memory.Size
	}
	if info.Config.Cpus != nil {
		out.CPUs = info.Config.Cpus.BootVcpus
	}
	return out, nil
}

// Counters returns the VM's device counters (vm.counters): bytes and
// operations per disk and network device.
func (v *VMM) Counters(ctx context.Context) (VmCounters, error) {
	var c VmCounters
	err := v.call(ctx, http.MethodGet, "vm.counters", nil, &c)
	return c, err
}

// Capabilities says what Cloud Hypervisor does; Version is known once
// Start or Adopt pinged the VMM.
func (v *VMM) Capabilities() vmm.Capabilities {
	return capabilities(v.cachedVersion())
}

// capabilities are Cloud Hypervisor's, its binary at version ver.
func capabilities(ver string) vmm.Capabilities {
	return vmm.Capabilities{
		Name:            "cloud-hypervisor",
		Version:         ver,
		SnapshotVersion: ver,
		Accelerator:     "kvm",
		Pause:           true,
		Snapshot:        true,
		OnDemandRestore: true,
		GuestChannel:    vmm.ChannelVsock,
		MultiConn:       true,
		ResizeDisk:      true,
		Kernel:          vmm.KernelVmlinux,
		Network:         "none (Cloud Hypervisor has no user-mode network)",
	}
}

// never is a channel that is never closed: Exited of a VMM not started.
var never = make(chan struct{})

// Exited is closed when the VMM process has exited (never, before Start).
func (v *VMM) Exited() <-chan struct{} {
	if p := v.process(); p != nil {
		return p.Exited()
	}
	return never
}

// ExitErr says how the process exited; nil while it runs.
func (v *VMM) ExitErr() error {
	if p := v.process(); p != nil {
		return p.Err()
	}
	return nil
}

// PID is the VMM process id, 0 before Start.
func (v *VMM) PID() int {
	if p := v.process(); p != nil {
		return p.PID()
	}
	return 0
}
