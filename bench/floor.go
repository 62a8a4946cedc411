package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// floorName is the floor's figure, which den's wake, restore and create
// are set against.
const floorName = "vmm floor: restore to agent ready (QEMU alone, local disk)"

// floorInTurn is the floor's figure for the guest sizes whose wakes
// wakeBySize times: what the VMM itself spends more on a larger guest.
const floorInTurn = "vmm floor: restore to agent ready (QEMU alone, 512M and 2G in turn)"

// floorGuest is the guest a floor restores.
type floorGuest struct {
	name    string // the figure
	label   string // its memory column ("512M")
	bytes   int64
	ballast bool // 64 MiB written in the guest before the snapshot, as wakeBySize's VMs have
	// identity: each sample then gives the restored guest a new
	// identity twice (identityFirst, identityAgain).
	identity bool
	note     string
}

// mainFloor is the floor of the 512 MiB figures.
var mainFloor = floorGuest{name: floorName, label: "512M", bytes: 512 << 20, identity: true,
	note: "no den: the driver restores a local snapshot into a fresh QEMU and waits for the agent; sampled between den's qemu figures"}

// ballastCmd gives a guest something in memory, as a working VM has.
const ballastCmd = "dd if=/dev/urandom of=/tmp/ballast bs=1M count=64 2>/dev/null; sync"

// floor times the VMM's own floor: QEMU alone (no den) restoring a
// snapshot of a booted guest of the image (512 MiB for the main floor),
// from a local disk with its RAM file on /dev/shm, to the agent
// answering ready. Every figure above it is den's own work. Its samples
// are taken between den's (the main floor's before each create and each
// 512 MiB lifecycle run): this host's speed drifts over minutes, and a
// ratio to a floor taken at another time drifts with it.
type floor struct {
	dir, shm string
	disk     string // the guest's disk, a fresh copy of pristine each sample
	pristine string // the disk as the snapshot left it
	snap     string
	cfg      vmm.Config
	signer   ssh.Signer
	accel    string
	n        int
	fig      Figure
	// idFirst and idAgain time a new identity in the guest, the first
	// after the restore and another right after, when the guest asks.
	identity         bool
	idFirst, idAgain Figure
}

// The figures of the floor's identities: what a create from a warm base
// or a fork asks of the guest after its restore, timed alone. Under TCG
// the first runs guest code a fresh QEMU has not translated yet.
const (
	identityFirst = "vmm floor: a new identity in the guest, first after the restore (QEMU alone)"
	identityAgain = "vmm floor: a new identity in the guest, again in the same QEMU (QEMU alone)"
)

// newFloor boots the floor's guest with QEMU alone, snapshots it, and
// takes one sample as a warm-up.
func newFloor(ctx context.Context, o Options, g floorGuest, say func(string)) (f *floor, err error) {
	f = &floor{fig: Figure{Name: g.name, VMM: "qemu", Memory: g.label, Unit: "ms", Note: g.note}, identity: g.identity}
	idNote := "no den: the RNG reseeded, hostname, machine-id, host keys and token, as a create from a warm base asks; no MAC or network (the floor's guest has no network device)"
	f.idFirst = Figure{Name: identityFirst, VMM: "qemu", Memory: g.label, Unit: "ms", Note: idNote}
	f.idAgain = Figure{Name: identityAgain, VMM: "qemu", Memory: g.label, Unit: "ms", Note: idNote}
	defer func() {
		if err != nil {
			f.close()
			err = fmt.Errorf("floor: %w", err)
		}
	}()
	if f.dir, err = os.MkdirTemp("/tmp", "den-floor-"); err != nil {
		return f, err
	}
	if f.shm, err = os.MkdirTemp("/dev/shm", "den-floor-"); err != nil {
		return f, err
	}
	images := image.Dir(o.Images)
	f.disk, f.pristine, f.snap = filepath.Join(f.dir, "disk.raw"), filepath.Join(f.dir, "pristine.raw"), filepath.Join(f.dir, "snap")
	if err := sparse.Copy(images.RootDisk(o.Image), f.disk); err != nil {
		return f, err
	}
	if _, f.signer, err = agent.NewEd25519Key("den-bench-floor"); err != nil {
		return f, err
	}
	f.accel = "tcg"
	if vmm.DetectKVM().Usable {
		f.accel = "kvm"
	}
	f.fig.Accel, f.idFirst.Accel, f.idAgain.Accel = f.accel, f.accel, f.accel
	f.cfg = vmm.Config{
		CPUs: 1, MemoryBytes: g.bytes, Kernel: images.BzImage(), Initramfs: images.Initramfs(),
		Cmdline: "console=ttyS0 root=/dev/vda rw panic=-1 " + agent.AuthorizedKeyArg(f.signer.PublicKey()) + " den.hostname=floor",
		Disks:   []vmm.Disk{{ID: "root", Path: f.disk}},
	}
	say("floor: booting a " + g.label + " guest with QEMU alone")
	v, err := f.newVMM(ctx)
	if err != nil {
		return f, err
	}
	defer func() {
		_ = v.Shutdown(context.Background())
		_ = os.Remove(f.ramFile(1)) // the booted guest's RAM: the snapshot has its copy
	}()
	if err := v.Create(ctx, f.cfg); err != nil {
		return f, err
	}
	if err := v.Boot(ctx); err != nil {
		return f, err
	}
	c, err := f.dial(ctx, v)
	if err != nil {
		return f, fmt.Errorf("boot: %w", err)
	}
	if g.ballast {
		_, err = c.Exec(ctx, agent.ExecRequest{CmdLine: ballastCmd})
	}
	c.Close()
	if err != nil {
		return f, fmt.Errorf("ballast: %w", err)
	}
	if err := v.Pause(ctx); err != nil {
		return f, err
	}
	if err := os.Mkdir(f.snap, 0o700); err != nil {
		return f, err
	}
	if err := v.Snapshot(ctx, f.snap); err != nil {
		return f, err
	}
	if err := v.Shutdown(ctx); err != nil {
		return f, err
	}
	if err := sparse.Copy(f.disk, f.pristine); err != nil {
		return f, err
	}
	say("floor: a warm-up restore (" + g.label + ")")
	_, err = f.restore(ctx, false)
	return f, err
}

func (f *floor) newVMM(ctx context.Context) (*qemu.VMM, error) {
	f.n++
	v := qemu.New(qemu.Options{RunDir: vmm.RunDir(filepath.Join(f.dir, fmt.Sprintf("r%d", f.n))), Accel: f.accel,
		RAMFile: f.ramFile(f.n)})
	return v, v.Start(ctx)
}

// ramFile is the RAM file of the floor's n-th VMM, on /dev/shm.
func (f *floor) ramFile(n int) string { return filepath.Join(f.shm, fmt.Sprintf("ram%d", n)) }

// dial waits (at most 3 minutes) for the guest's agent to answer ready.
func (f *floor) dial(ctx context.Context, v *qemu.VMM) (*agent.Client, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, _, err := agent.WaitReady(rctx, func(ctx context.Context) (net.Conn, error) { return v.DialGuest(ctx, agent.Port) }, f.signer)
	return c, err
}

// newIdentities gives the guest behind c a new identity twice, each with
// a hostname of its own (an unchanged one skips a file), and times each
// into idFirst and idAgain.
func (f *floor) newIdentities(ctx context.Context, c *agent.Client) error {
	for i, fig := range []*Figure{&f.idFirst, &f.idAgain} {
		which := [...]string{"first", "again"}[i]
		var tok [16]byte
		if _, err := rand.Read(tok[:]); err != nil {
			return fmt.Errorf("new identity (%s): token: %w", which, err)
		}
		start := time.Now()
		if _, err := c.NewIdentityToken(ctx, fmt.Sprintf("floor-%d-%s", f.n, which), hex.EncodeToString(tok[:])); err != nil {
			return fmt.Errorf("new identity (%s): %w", which, err)
		}
		fig.Samples = append(fig.Samples, float64(time.Since(start).Microseconds())/1000)
	}
	return nil
}

// sample times one restore of the snapshot into a fresh QEMU, to the
// agent answering ready, and adds its steps to tr (if not nil).
func (f *floor) sample(ctx context.Context, say func(string), tr *traces) error {
	if f == nil {
		return nil
	}
	say(fmt.Sprintf("floor: restore, %s (sample %d)", f.fig.Memory, len(f.fig.Samples)+1))
	rec := phase.New()
	cpu, err := f.restore(phase.With(ctx, rec), true)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	if tr != nil {
		var steps []timedStep
		for _, s := range rec.Steps() {
			steps = append(steps, timedStep{s.Name, float64(s.Took.Microseconds()) / 1000})
		}
		tr.add(f.fig.Name, "qemu", f.fig.Memory, f.fig.Samples[len(f.fig.Samples)-1], cpu, steps)
	}
	return nil
}

// restore restores the snapshot into a fresh QEMU, to the agent answering
// ready, and returns the host's CPU time over that (-1: unknown). With
// record it adds its time to the floor's figure, then times the guest's
// two new identities (not in the warm-up).
func (f *floor) restore(ctx context.Context, record bool) (cpu float64, err error) {
	// The disk as the snapshot left it (the last guest wrote to it).
	if err := os.Remove(f.disk); err != nil {
		return -1, err
	}
	if err := sparse.Copy(f.pristine, f.disk); err != nil {
		return -1, err
	}
	v, err := f.newVMM(ctx)
	if err != nil {
		return -1, err
	}
	defer func() {
		_ = v.Shutdown(context.Background())
		_ = os.Remove(f.ramFile(f.n))
	}()
	start, span := time.Now(), startCPU()
	end := phase.Begin(ctx, "vmm restore")
	err = v.Restore(ctx, f.snap, vmm.RestoreOptions{Resume: true, Config: &f.cfg})
	end()
	if err != nil {
		return -1, fmt.Errorf("restore: %w", err)
	}
	end = phase.Begin(ctx, "agent ready")
	c, err := f.dial(ctx, v)
	end()
	if err != nil {
		return -1, fmt.Errorf("restore: %w", err)
	}
	defer c.Close()
	if record {
		f.fig.Samples = append(f.fig.Samples, float64(time.Since(start).Microseconds())/1000)
	}
	cpu = span.ms()
	if f.identity && record {
		return cpu, f.newIdentities(ctx, c)
	}
	return cpu, nil
}

// figure is the floor's figure over its samples.
func (f *floor) figure() Figure { return withStats(f.fig) }

// withStats is fig with the median, min and max of its samples.
func withStats(fig Figure) Figure {
	fig.Median, fig.Min, fig.Max = stats(fig.Samples)
	return fig
}

// figures is the floor's figure, and its identities' when it timed them.
func (f *floor) figures() []Figure {
	out := []Figure{f.figure()}
	if f.identity && len(f.idFirst.Samples) > 0 && len(f.idFirst.Samples) == len(f.idAgain.Samples) {
		out = append(out, withStats(f.idFirst), withStats(f.idAgain))
	}
	return out
}

func (f *floor) close() {
	if f == nil {
		return
	}
	if f.dir != "" {
		_ = os.RemoveAll(f.dir)
	}
	if f.shm != "" {
		_ = os.RemoveAll(f.shm)
	}
}
