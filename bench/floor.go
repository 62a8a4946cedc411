package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/fsutil"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// floorFigure measures the VMM's own floor, which den's wake, restore and
// create are set against: QEMU alone (no den) restoring a snapshot of a
// booted 512 MiB guest of the image, from a local disk with its RAM file
// on /dev/shm, to the agent answering ready. Every figure above it is
// den's own work.
func floorFigure(ctx context.Context, o Options, say func(string)) (Figure, error) {
	f := Figure{Name: "vmm floor: restore to agent ready (QEMU alone, local disk)", VMM: "qemu", Memory: "512M", Unit: "ms",
		Note: "no den: the driver restores a local snapshot into a fresh QEMU and waits for the agent; measured before and after den's qemu figures"}
	images := image.Dir(o.Images)
	dir, err := os.MkdirTemp("/tmp", "den-floor-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	disk := filepath.Join(dir, "disk.raw")
	if err := fsutil.CopySparse(images.RootDisk(o.Image), disk); err != nil {
		return f, fmt.Errorf("floor: %w", err)
	}
	_, signer, err := agent.NewEd25519Key("den-bench-floor")
	if err != nil {
		return f, err
	}
	kvm := vmm.DetectKVM()
	accel := "tcg"
	if kvm.Usable {
		accel = "kvm"
	}
	f.Accel = accel
	shm, err := os.MkdirTemp("/dev/shm", "den-floor-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(shm)
	cfg := vmm.Config{
		CPUs: 1, MemoryBytes: 512 << 20, Kernel: images.BzImage(), Initramfs: images.Initramfs(),
		Cmdline: "console=ttyS0 root=/dev/vda rw panic=-1 " + agent.AuthorizedKeyArg(signer.PublicKey()) + " den.hostname=floor",
		Disks:   []vmm.Disk{{ID: "root", Path: disk}},
	}
	n := 0
	newVMM := func() (*qemu.VMM, error) {
		n++
		v := qemu.New(qemu.Options{RunDir: vmm.RunDir(filepath.Join(dir, fmt.Sprintf("r%d", n))), Accel: accel,
			RAMFile: filepath.Join(shm, fmt.Sprintf("ram%d", n))})
		return v, v.Start(ctx)
	}
	ready := func(v *qemu.VMM) error {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		c, _, err := agent.WaitReady(rctx, func(ctx context.Context) (net.Conn, error) { return v.DialGuest(ctx, agent.Port) }, signer)
		if err == nil {
			c.Close()
		}
		return err
	}
	say("floor: booting a guest with QEMU alone")
	v, err := newVMM()
	if err != nil {
		return f, err
	}
	defer func() { _ = v.Shutdown(context.Background()) }()
	if err := v.Create(ctx, cfg); err != nil {
		return f, err
	}
	if err := v.Boot(ctx); err != nil {
		return f, err
	}
	if err := ready(v); err != nil {
		return f, fmt.Errorf("floor: boot: %w", err)
	}
	for i := 0; i < o.Runs+1; i++ { // the first is a warm-up
		say(fmt.Sprintf("floor: snapshot and restore (%d/%d)", i+1, o.Runs+1))
		snap := filepath.Join(dir, fmt.Sprintf("snap%d", i))
		if err := os.Mkdir(snap, 0o700); err != nil {
			return f, err
		}
		if err := v.Pause(ctx); err != nil {
			return f, err
		}
		if err := v.Snapshot(ctx, snap); err != nil {
			return f, err
		}
		if err := v.Shutdown(ctx); err != nil {
			return f, err
		}
		w, err := newVMM()
		if err != nil {
			return f, err
		}
		v = w
		start := time.Now()
		if err := v.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, Config: &cfg}); err != nil {
			return f, fmt.Errorf("floor: restore: %w", err)
		}
		if err := ready(v); err != nil {
			return f, fmt.Errorf("floor: restore: %w", err)
		}
		if i > 0 {
			f.Samples = append(f.Samples, float64(time.Since(start).Microseconds())/1000)
		}
	}
	f.Median, f.Min, f.Max = stats(f.Samples)
	return f, nil
}
