// Package qemu drives one QEMU microvm process per VM over QMP, for hosts
// without Cloud Hypervisor or without a KVM that boots stock kernels.
//
// Guest RAM lives in a file (memory-backend-file, share=on) in the VM's
// runtime directory, so a snapshot migrates only device state
// (x-ignore-shared) and copies the RAM file; the guest agent is reached
// over one virtio-serial port backed by a unix socket.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/vmm"
	"golang.org/x/sys/unix"
)

var (
	_ vmm.Hypervisor  = (*VMM)(nil)
	_ vmm.Prelauncher = (*VMM)(nil)
)

// AgentPortName is the virtio-serial port name the guest agent opens.
const AgentPortName = "org.den.agent"

// Options configures a VMM.
type Options struct {
	// Binary is qemu-system-x86_64; FindBinary when empty.
	Binary string
	// RunDir holds the QMP socket, agent socket, RAM file, PID file, logs.
	RunDir vmm.RunDir
	// Accel is "kvm", "tcg", or "" to choose: KVM only where it really
	// boots stock guests (vmm.DetectKVM), else TCG with a warning.
	Accel string
	// Logger receives warnings (nil: slog.Default()).
	Logger *slog.Logger
	// StreamRAM snapshots without x-ignore-shared: the RAM goes through
	// the migration stream instead of a copy of the RAM file. Slower; it
	// exists to measure what x-ignore-shared saves (den bench).
	StreamRAM bool
	// RAMFile backs the guest's RAM; it belongs on a memory filesystem
	// (tmpfs), never on a disk one, where every dirty guest page becomes
	// host writeback. Empty: RunDir.MemoryFile().
	RAMFile string
	// Confine is the user QEMU runs as and the cgroup it starts in.
	// That user gets the run dir and the RAM file; disks and snapshot
	// files reach QEMU as fds the driver opens, never by path.
	Confine vmm.Confine
}

// ramFile is the file that backs guest RAM.
func (v *VMM) ramFile() string {
	if v.opts.RAMFile != "" {
		return v.opts.RAMFile
	}
	return v.opts.RunDir.MemoryFile()
}

var (
	_ vmm.Hypervisor       = (*VMM)(nil)
	_ vmm.DeltaSnapshotter = (*VMM)(nil)
)

// VMM is one QEMU process and its VM.
type VMM struct {
	opts  Options
	accel string

	mu     sync.Mutex
	proc   *vmm.Process
	cfg    *vmm.Config
	booted bool // the VM has run (so "paused" is Paused, not Created)
	// prelaunched is the RAM file of a process Prelaunch started for
	// the coming Restore, "" otherwise.
	prelaunched string
}

// New returns a driver for one VM; nothing starts until Start and Create.
func New(opts Options) *VMM {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &VMM{opts: opts}
}

// FindBinary returns $DEN_QEMU_BINARY or qemu-system-x86_64 from PATH.
func FindBinary() (string, error) {
	if b := os.Getenv("DEN_QEMU_BINARY"); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("find qemu: DEN_QEMU_BINARY: %w", err)
		}
		return b, nil
	}
	b, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", errors.New("find qemu: qemu-system-x86_64 not in PATH (apt-get install qemu-system-x86)")
	}
	return b, nil
}

// Version runs `qemu-system-x86_64 --version` and returns its version.
func Version(ctx context.Context, binary string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("qemu version: %w", err)
	}
	// "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18)"
	f := strings.Fields(strings.SplitN(string(out), "\n", 2)[0])
	for i, w := range f {
		if w == "version" && i+1 < len(f) {
			return f[i+1], nil
		}
	}
	return strings.TrimSpace(string(out)), nil
}

// Capabilities implements vmm.Hypervisor.
func (v *VMM) Capabilities() vmm.Capabilities {
	ver := ""
	if v.opts.Binary != "" {
		ver, _ = Version(context.Background(), v.opts.Binary)
	}
	return capabilities(v.accelerator(), ver)
}

// capabilities are QEMU's under accelerator accel, its binary at version
// ver.
func capabilities(accel, ver string) vmm.Capabilities {
	return vmm.Capabilities{
		Name:            "qemu",
		Version:         ver,
		SnapshotVersion: majorMinor(ver),
		Accelerator:     accel,
		Pause:           true,
		Snapshot:        true,
		GuestChannel:    vmm.ChannelSerial,
		MultiConn:       false,
		ResizeDisk:      true,
		Kernel:          vmm.KernelBzImage,
		RAMFile:         true,
		UserNet:         true,
		// QEMU's user-mode network: the guest is 10.0.2.15 behind NAT.
		Network: "qemu user-mode networking (outbound NAT only, no inbound)",
	}
}

// majorMinor is "7.2" of QEMU version "7.2.22" ("" of "").
func majorMinor(ver string) string {
	parts := strings.SplitN(ver, ".", 3)
	if len(parts) < 2 {
		return ver
	}
	return parts[0] + "." + parts[1]
}

// accelerator resolves Options.Accel once, warning once about TCG.
func (v *VMM) accelerator() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.accel != "" {
		return v.accel
	}
	v.accel = v.opts.Accel
	if v.accel == "" {
		st := vmm.DetectKVM()
		v.accel = st.Accelerator()
		if v.accel == "tcg" {
			warnTCG(v.opts.Logger, st.Reason)
		}
	}
	return v.accel
}

var tcgWarned sync.Once

func warnTCG(log *slog.Logger, reason string) {
	tcgWarned.Do(func() {
		log.Warn("qemu: using TCG software emulation, guests are slow; " + reason)
	})
}

// Start checks that QEMU can run here. QEMU's machine is fixed on its
// command line, so the process itself starts in Create or Restore.
func (v *VMM) Start(ctx context.Context) error {
	if v.opts.Binary == "" {
		b, err := FindBinary()
		if err != nil {
			return err
		}
		v.opts.Binary = b
	}
	if err := os.MkdirAll(v.opts.RunDir.Path(), 0o700); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(v.ramFile()), 0o700); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	v.accelerator()
	return nil
}

// Create starts QEMU with the VM defined and its vCPUs stopped (-S).
func (v *VMM) Create(ctx context.Context, cfg vmm.Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("create vm: %w", err)
	}
	if err := v.checkNoVM("create"); err != nil {
		return err
	}
	if err := v.launch(ctx, cfg, false, v.ramFile(), nil); err != nil {
		return fmt.Errorf("create vm: %w", err)
	}
	return nil
}

// Prelaunch starts QEMU for a coming Restore, waiting for its incoming
// migration (vmm.Prelauncher): its RAM is p.Memory (the Restore's
// StagedMemory), its disks the files p.DiskFiles names, its TAPs those
// p.Pred, the VM's running QEMU, holds. Restore then only migrates in.
func (v *VMM) Prelaunch(ctx context.Context, cfg vmm.Config, p vmm.Prelaunch) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("prelaunch qemu: %w", err)
	}
	if err := v.checkNoVM("prelaunch"); err != nil {
		return err
	}
	if err := checkRAMFile(p.Memory, cfg.MemoryBytes); err != nil {
		return fmt.Errorf("prelaunch qemu: %w", err)
	}
	if err := v.launch(ctx, cfg, true, p.Memory, &p); err != nil {
		return fmt.Errorf("prelaunch qemu: %w", err)
	}
	v.mu.Lock()
	v.prelaunched = p.Memory
	v.mu.Unlock()
	return nil
}

// MoveRunDir renames the runtime directory to rd, which must not exist,
// and uses it from then on (vmm.Prelauncher). QEMU's sockets move with
// it; it is called before any other use of the moved VMM.
func (v *VMM) MoveRunDir(rd vmm.RunDir) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := os.Rename(v.opts.RunDir.Path(), rd.Path()); err != nil {
		return fmt.Errorf("move qemu run dir: %w", err)
	}
	v.opts.RunDir = rd
	return nil
}

// alive says whether the QEMU process runs.
func (v *VMM) alive() bool {
	p := v.process()
	return p != nil && p.Alive()
}

// process is the QEMU process, nil before Create or Restore.
func (v *VMM) process() *vmm.Process {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.proc
}

// checkNoVM fails when this VMM already runs a VM.
func (v *VMM) checkNoVM(op string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.proc != nil && v.proc.Alive() {
		return fmt.Errorf("%s vm: qemu already has a vm (pid %d): %w", op, v.proc.PID(), vmm.ErrInvalidState)
	}
	return nil
}

// launch starts the QEMU process for cfg, its RAM in the file ram, and
// waits until QMP answers; pre is a prelaunch's files (inheritedFiles).
func (v *VMM) launch(ctx context.Context, cfg vmm.Config, incoming bool, ram string, pre *vmm.Prelaunch) error {
	// Opened first: a missing disk or boot file fails before anything
	// is written.
	end := phase.Begin(ctx, "qemu: open files, write config")
	files, err := inheritedFiles(ctx, cfg, pre)
	if err != nil {
		end()
		return err
	}
	defer closeAll(files)
	rd := v.opts.RunDir
	for _, p := range []string{rd.APISocket(), rd.AgentSocket()} {
		_ = os.Remove(p)
	}
	if err := atomicfile.WriteJSON(rd.ConfigFile(), cfg, 0o600); err != nil {
		end()
		return err
	}
	if u := v.opts.Confine.User; u != nil {
		if err := u.Own(rd.Path(), rd.ConsoleLog(), filepath.Dir(ram), ram); err != nil {
			end()
			return err
		}
	}
	end()
	end = phase.Begin(ctx, "qemu: start the process")
	args := buildArgs(cfg, rd, ram, v.accelerator(), incoming)
	proc, err := vmm.StartProcess(vmm.ProcessSpec{
		Binary:     v.opts.Binary,
		Args:       args,
		Log:        rd.Log(),
		PIDFile:    rd.PIDFile(),
		Dir:        rd.Path(),
		Confine:    v.opts.Confine,
		ExtraFiles: files,
	})
	end()
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.proc, v.cfg, v.booted, v.prelaunched = proc, &cfg, false, ""
	v.mu.Unlock()
	defer phase.Begin(ctx, "qemu: wait for qmp")()
	if err := v.waitQMP(ctx, proc); err != nil {
		_ = proc.Stop(2 * time.Second)
		if strings.Contains(err.Error(), "backing store") {
			err = fmt.Errorf("%w (RAM file: %s)", err, describeOwners(ram))
		}
		return err
	}
	return nil
}

// describeOwners says who owns path and the directories above it, up to
// the first that others may pass through: what a VMM that could not open
// the path ran into.
func describeOwners(path string) string {
	var parts []string
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", p, err))
		} else {
			parts = append(parts, fmt.Sprintf("%s %04o %d:%d", p, st.Mode&0o7777, st.Uid, st.Gid))
			if st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Mode&0o001 != 0 {
				break
			}
		}
		if p == "/" || p == "." {
			break
		}
	}
	return strings.Join(parts, ", ")
}

// waitQMP waits, bounded by ctx, for the QMP socket to answer.
func (v *VMM) waitQMP(ctx context.Context, proc *vmm.Process) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		q, err := dialQMP(ctx, v.opts.RunDir.APISocket())
		if err == nil {
			q.close()
			return nil
		}
		select {
		case <-proc.Exited():
			return fmt.Errorf("qemu exited during start: %s (log %s)", vmm.TailFile(v.opts.RunDir.Log(), 600), v.opts.RunDir.Log())
		case <-ctx.Done():
			return fmt.Errorf("qemu qmp socket %s did not answer: %w (log %s: %s)", v.opts.RunDir.APISocket(), ctx.Err(), v.opts.RunDir.Log(), vmm.TailFile(v.opts.RunDir.Log(), 300))
		case <-tick.C:
		}
	}
}

// call runs one QMP command in a session of its own, bounded by ctx (or
// vmm.DefaultCallTimeout), and turns a dead process into ErrNotRunning.
func (v *VMM) call(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	var ret json.RawMessage
	err := v.session(ctx, cmd, func(ctx context.Context, q *qmpConn) error {
		var err error
		ret, err = q.execute(ctx, cmd, args)
		return err
	})
	return ret, err
}

// session runs f on a QMP session of its own (commands that must share
// one: getfd and the command using the fd), like call.
func (v *VMM) session(ctx context.Context, op string, f func(context.Context, *qmpConn) error) error {
	proc := v.process()
	if proc == nil || !proc.Alive() {
		return v.notRunning(op)
	}
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	q, err := dialQMP(ctx, v.opts.RunDir.APISocket())
	if err != nil {
		if !proc.Alive() {
			return v.notRunning(op)
		}
		return fmt.Errorf("qmp %s: %w", op, err)
	}
	defer q.close()
	err = f(ctx, q)
	if err != nil && !proc.Alive() {
		return v.notRunning(op)
	}
	return err
}

func (v *VMM) notRunning(op string) error {
	return fmt.Errorf("qemu %s: %w (log %s: %s)", op, vmm.ErrNotRunning, v.opts.RunDir.Log(), vmm.TailFile(v.opts.RunDir.Log(), 300))
}

// Boot runs the created VM's vCPUs.
func (v *VMM) Boot(ctx context.Context) error {
	if err := v.transition(ctx, "boot"); err != nil {
		return err
	}
	if _, err := v.call(ctx, "cont", nil); err != nil {
		return fmt.Errorf("boot vm: %w", err)
	}
	v.mu.Lock()
	v.booted = true
	v.mu.Unlock()
	return nil
}

// Pause stops the vCPUs.
func (v *VMM) Pause(ctx context.Context) error {
	if err := v.transition(ctx, "pause"); err != nil {
		return err
	}
	if _, err := v.call(ctx, "stop", nil); err != nil {
		return fmt.Errorf("pause vm: %w", err)
	}
	return nil
}

// Resume runs the vCPUs of a paused VM.
func (v *VMM) Resume(ctx context.Context) error {
	if err := v.transition(ctx, "resume"); err != nil {
		return err
	}
	if _, err := v.call(ctx, "cont", nil); err != nil {
		return fmt.Errorf("resume vm: %w", err)
	}
	v.mu.Lock()
	v.booted = true
	v.mu.Unlock()
	return nil
}

// transition checks op against the VM's current state.
func (v *VMM) transition(ctx context.Context, op string) error {
	info, err := v.Info(ctx)
	if err != nil {
		return fmt.Errorf("%s vm: %w", op, err)
	}
	if err := vmm.CheckTransition(op, info.State); err != nil {
		return fmt.Errorf("%s vm: %w", op, err)
	}
	return nil
}

// Info maps QEMU's run state onto vmm.State.
func (v *VMM) Info(ctx context.Context) (vmm.Info, error) {
	v.mu.Lock()
	proc, cfg, booted := v.proc, v.cfg, v.booted
	v.mu.Unlock()
	if proc == nil {
		return vmm.Info{State: vmm.StateNotCreated}, nil
	}
	if !proc.Alive() {
		return vmm.Info{State: vmm.StateShutdown, PID: proc.PID()}, nil
	}
	ret, err := v.call(ctx, "query-status", nil)
	if err != nil {
		return vmm.Info{}, fmt.Errorf("vm info: %w", err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(ret, &st); err != nil {
		return vmm.Info{}, fmt.Errorf("vm info: %w", err)
	}
	info := vmm.Info{PID: proc.PID(), State: mapStatus(st.Status, booted)}
	if cfg != nil {
		info.CPUs, info.MemoryBytes = cfg.CPUs, cfg.MemoryBytes
	}
	return info, nil
}

// mapStatus turns a QEMU RunState into a vmm.State.
func mapStatus(status string, booted bool) vmm.State {
	switch status {
	case "running":
		return vmm.StateRunning
	case "prelaunch":
		return vmm.StateCreated
	case "paused", "postmigrate", "finish-migrate", "save-vm", "restore-vm", "suspended", "debug", "watchdog":
		if booted {
			return vmm.StatePaused
		}
		return vmm.StateCreated
	case "inmigrate":
		return vmm.StateNotCreated
	case "shutdown", "guest-panicked", "internal-error", "io-error":
		return vmm.StateShutdown
	}
	return vmm.State(status)
}

// Shutdown quits QEMU and waits until the process is gone. The guest
// gets no notice: ask its agent to power off first for a clean
// filesystem.
func (v *VMM) Shutdown(ctx context.Context) error {
	proc := v.process()
	if proc == nil || !proc.Alive() {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, _ = v.call(qctx, "quit", nil)
	cancel()
	select {
	case <-proc.Exited():
	case <-time.After(3 * time.Second):
	}
	if err := proc.Stop(5 * time.Second); err != nil {
		return fmt.Errorf("shutdown qemu: %w", err)
	}
	return nil
}

// Discard kills QEMU (SIGKILL): no quit, so no flush of the disks,
// whose writes the caller throws away; 5-10 ms where a quit takes
// 10-60 ms here.
func (v *VMM) Discard(ctx context.Context) error {
	proc := v.process()
	if proc == nil {
		return nil
	}
	if err := proc.Kill(); err != nil {
		return fmt.Errorf("discard qemu: %w", err)
	}
	return nil
}

// DialGuest connects to the agent's virtio-serial port. There is one
// stream per VM: a second dial waits until the first connection closes.
// After a Restore, dial again.
func (v *VMM) DialGuest(ctx context.Context, port uint32) (net.Conn, error) {
	proc := v.process()
	if proc == nil || !proc.Alive() {
		return nil, v.notRunning("dial guest")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", v.opts.RunDir.AgentSocket())
	if err != nil {
		return nil, fmt.Errorf("dial guest agent: %w", err)
	}
	return conn, nil
}

// Exited is closed when the QEMU process exits (never, before Create).
func (v *VMM) Exited() <-chan struct{} {
	if p := v.process(); p != nil {
		return p.Exited()
	}
	return nil
}

// ExitErr says how the process exited.
func (v *VMM) ExitErr() error {
	if p := v.process(); p != nil {
		return p.Err()
	}
	return nil
}

// PID is the QEMU process id, 0 before Create or Restore.
func (v *VMM) PID() int {
	if p := v.process(); p != nil {
		return p.PID()
	}
	return 0
}

// Adopt re-attaches to a QEMU process that an earlier driver started in
// opts.RunDir (after a daemon restart), checking that QMP answers.
func Adopt(ctx context.Context, opts Options) (*VMM, error) {
	v := New(opts)
	proc, err := vmm.AdoptProcess(opts.RunDir.PIDFile())
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(opts.RunDir.ConfigFile())
	if err != nil {
		return nil, fmt.Errorf("adopt qemu: %w", err)
	}
	var cfg vmm.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("adopt qemu: config: %w", err)
	}
	v.proc, v.cfg, v.booted = proc, &cfg, true
	if opts.Accel != "" {
		v.accel = opts.Accel
	}
	if _, err := v.call(ctx, "query-status", nil); err != nil {
		return nil, fmt.Errorf("adopt qemu: %w", err)
	}
	return v, nil
}
