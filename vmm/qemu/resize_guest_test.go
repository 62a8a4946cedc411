package qemu_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// minimalDisk is the size of the minimal image's root disk.
const minimalDisk = 256 << 20

// growRoot asks the agent to grow / to a device of at least want bytes and
// checks the reply and what df sees.
func growRoot(t *testing.T, c *agent.Client, want int64) agent.GrowReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := c.GrowRoot(ctx, want)
	if err != nil {
		t.Fatalf("grow root to %d: %v", want, err)
	}
	t.Logf("grow root: %+v in %v", rep, time.Since(start).Round(time.Millisecond))
	if rep.Device != "/dev/vda" || rep.DeviceBytes != want || rep.NewBytes != want {
		t.Fatalf("grow root: %+v, want /dev/vda of %d bytes filled", rep, want)
	}
	// df leaves out the filesystem's metadata (inode tables, journal).
	kb := dfKB(t, c)
	t.Logf("df -k /: %d KiB", kb)
	if kb*1024 < want*85/100 || kb*1024 > want {
		t.Fatalf("df -k / says %d KiB, want about %d", kb, want>>10)
	}
	return rep
}

// dfKB is the size of / in KiB as the guest's df shows it.
func dfKB(t *testing.T, c *agent.Client) int64 {
	t.Helper()
	out, code := run(t, c, "df -k /")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if code != 0 || len(f) < 5 {
		t.Fatalf("df -k /: %q (exit %d)", out, code)
	}
	kb, err := strconv.ParseInt(f[len(f)-5], 10, 64)
	if err != nil {
		t.Fatalf("df -k /: %q: %v", out, err)
	}
	return kb
}

// TestGuestResizeDiskAndGrowRoot grows a running guest's disk through
// QMP, a paused one's too, and a file grown behind QEMU's back, and the
// guest's root filesystem after each, online.
func TestGuestResizeDiskAndGrowRoot(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	if !v.Capabilities().ResizeDisk {
		t.Fatal("qemu capabilities say no ResizeDisk")
	}
	c := e.boot(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The image's filesystem fills its disk: nothing to do.
	rep, err := c.GrowRoot(ctx, 0)
	if err != nil || rep.OldBytes != minimalDisk || rep.NewBytes != minimalDisk || rep.DeviceBytes != minimalDisk {
		t.Fatalf("grow root of a full disk: %+v %v", rep, err)
	}
	run(t, c, "echo kept > /root/kept && sync")

	// A file grown behind QEMU's back (den create truncates the image):
	// the guest sees it once QEMU is told, at the same size.
	if err := os.Truncate(e.disk, 512<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GrowRoot(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if kb := dfKB(t, c); kb > minimalDisk>>10 {
		t.Fatalf("df sees %d KiB before QEMU was told", kb)
	}
	start := time.Now()
	if err := v.ResizeDisk(ctx, "root", 512<<20); err != nil {
		t.Fatal(err)
	}
	t.Logf("block_resize in %v", time.Since(start).Round(time.Millisecond))
	growRoot(t, c, 512<<20)

	// Through QMP while paused: the guest hears of it on resume.
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.ResizeDisk(ctx, "", 768<<20); err != nil {
		t.Fatal(err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	growRoot(t, c, 768<<20)

	// Running: 1 GiB, then again (nothing to do).
	if err := v.ResizeDisk(ctx, "root", 1<<30); err != nil {
		t.Fatal(err)
	}
	rep = growRoot(t, c, 1<<30)
	if kb := dfKB(t, c); kb < 900<<10 {
		t.Errorf("df -k / says %d KiB on a 1 GiB disk, want more than 900 MiB", kb)
	}
	if rep.OldBytes != 768<<20 {
		t.Errorf("grown from %d, want %d", rep.OldBytes, 768<<20)
	}
	if rep, err := c.GrowRoot(ctx, 1<<30); err != nil || rep.OldBytes != rep.NewBytes {
		t.Fatalf("second grow: %+v %v", rep, err)
	}

	// Refusals.
	if err := v.ResizeDisk(ctx, "root", 512<<20); err == nil || !strings.Contains(err.Error(), "refusing to shrink") {
		t.Errorf("shrink: %v", err)
	}
	if err := v.ResizeDisk(ctx, "data", 2<<30); !errors.Is(err, vmm.ErrNoSuchDisk) {
		t.Errorf("unknown disk: %v", err)
	}
	if _, err := c.Freeze(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := v.ResizeDisk(ctx, "root", 1280<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GrowRoot(ctx, 1280<<20); err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Errorf("grow while frozen: %v", err)
	}
	if _, err := c.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	growRoot(t, c, 1280<<20)
	if out, _ := run(t, c, "cat /root/kept"); out != "kept\n" {
		t.Fatalf("file written before the grows: %q", out)
	}

	checkFS(t, v, c, e.disk)
}

// TestGuestGrowRootAfterRestore is den create's path: a snapshot of a
// guest booted on the small disk, the disk file grown, the snapshot
// restored, then the VMM told the (unchanged) size and the guest grown.
func TestGuestGrowRootAfterRestore(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	c := e.boot(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c.Close()
	snap := e.snapshot(t, v)
	if err := v.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(e.disk, 1<<30); err != nil {
		t.Fatal(err)
	}

	w := e.newVMM(t, "b")
	if err := w.Restore(ctx, snap, vmm.RestoreOptions{Resume: true}); err != nil {
		t.Fatal(err)
	}
	c2 := e.connect(t, w)
	if kb := dfKB(t, c2); kb > minimalDisk>>10 {
		t.Fatalf("df sees %d KiB before QEMU was told", kb)
	}
	if err := w.ResizeDisk(ctx, "root", 1<<30); err != nil {
		t.Fatal(err)
	}
	growRoot(t, c2, 1<<30)
	checkFS(t, w, c2, e.disk)
}

// checkFS powers the guest off and checks the grown filesystem with
// e2fsck on the host.
func checkFS(t *testing.T, v *qemu.VMM, c *agent.Client, disk string) {
	t.Helper()
	fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		t.Log("e2fsck not installed: filesystem not checked")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Poweroff(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.Exited():
	case <-time.After(time.Minute):
		t.Fatal("guest did not power off within a minute")
	}
	out, err := exec.Command(fsck, "-fn", disk).CombinedOutput()
	if err != nil {
		t.Fatalf("e2fsck -fn: %v\n%s", err, out)
	}
}
