package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/vmm"
)

// A restore prelaunches its QEMU beside the running one and shares its
// TAP; the running one may be killed at any moment meanwhile. Killed, a
// process drops its files before its exit is noticed (pidfd_getfd then
// says ESRCH): the prelaunch must then wait for it and attach to the TAP
// itself, not fail.
func TestPrelaunchTakesTheTapOfAnExitingPredecessor(t *testing.T) {
	testutil.NeedRoot(t, "makes a TAP device")
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skipf("no ip command: %v", err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("dntest%d", os.Getpid()%100000)
	if out, err := exec.Command(ip, "tuntap", "add", "dev", name, "mode", "tap", "vnet_hdr").CombinedOutput(); err != nil {
		t.Fatalf("make tap %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { exec.Command(ip, "link", "del", name).Run() })

	cfg := vmm.Config{Net: []vmm.Net{{ID: "net0", Tap: name}}}
	if got := tapFD(cfg, 0); got != 3 {
		t.Fatalf("tapFD = %d, want 3 without disks", got)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Both outcomes of the race are taken many times: the fd taken from
	// a predecessor not yet dying, and the TAP opened after one that was.
	for i := range 100 {
		tap, err := openTap(name)
		if err != nil {
			t.Fatal(err)
		}
		// A stand-in for the running QEMU: a process holding the TAP
		// where QEMU's net device 0 has it (fd 3).
		proc, err := vmm.StartProcess(vmm.ProcessSpec{Binary: sleep, Args: []string{"60"}, Log: filepath.Join(dir, "log"), ExtraFiles: []*os.File{tap}})
		tap.Close()
		if err != nil {
			t.Fatal(err)
		}
		pred := New(Options{RunDir: vmm.RunDir(filepath.Join(dir, "pred"))})
		pred.proc, pred.cfg = proc, &cfg
		if err := syscall.Kill(proc.PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		files, err := inheritedFiles(ctx, cfg, &vmm.Prelaunch{Pred: pred})
		if err != nil {
			t.Fatalf("try %d: share the tap of a predecessor being killed: %v", i, err)
		}
		ifr, err := unix.NewIfreq("")
		if err == nil {
			err = unix.IoctlIfreq(int(files[0].Fd()), unix.TUNGETIFF, ifr)
		}
		if err != nil || ifr.Name() != name {
			t.Fatalf("try %d: fd 3 is not tap %s: %v", i, name, err)
		}
		closeAll(files)
		select {
		case <-proc.Exited():
		case <-ctx.Done():
			t.Fatalf("try %d: the killed stand-in did not exit", i)
		}
	}
}
