package cloudhypervisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/cgroup"
	"github.com/denhq/den/vmm"
)

// TestRealBinaryLifecycle runs a real cloud-hypervisor (DEN_CH_BINARY)
// through start, create, boot, info, pause, resume, snapshot, restore into
// fresh processes with Copy and OnDemand memory, and shutdown. It needs a
// guest kernel: DEN_TEST_KERNEL (and DEN_TEST_INITRAMFS), or vmlinux and
// initramfs.img in $DEN_IMAGE_DIR. Where the host refuses an operation
// (PVM /dev/kvm, no nested state, no userfaultfd) it skips saying which
// and why.
func TestRealBinaryLifecycle(t *testing.T) {
	bin := os.Getenv(BinaryEnv)
	if bin == "" {
		t.Skipf("%s does not name a cloud-hypervisor binary; this test needs one (the replay tests cover the API without it)", BinaryEnv)
	}
	kernel, initramfs, missing := testKernel()
	if kernel == "" {
		t.Skip(missing)
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		t.Skipf("cloud-hypervisor needs /dev/kvm: %v", err)
	} else {
		f.Close()
	}
	ctx := testCtx(t, 3*time.Minute)

	// Confined as den runs it: landlock on (seccomp is on by default),
	// and, as root, user nobody (with group kvm) in a cgroup of its own.
	files := shortDir(t) // the disk and the snapshot
	c := realConfine(t, files)
	opts := func(rd string) Options {
		return Options{Binary: bin, RunDir: vmm.RunDir(rd), Logger: testLogger(t), Confine: c,
			Landlock: true, LandlockRules: []LandlockConfig{{Path: files, Access: "rw"}}}
	}
	o := opts(ownedDir(t, c))
	o.Verbosity = 1
	v := New(o)
	t.Cleanup(func() { stopLeftover(t, v) })
	must(t, "start", v.Start(ctx))
	checkConfined(t, v.PID(), c)
	if ver := v.Capabilities().Version; !IsPinned(ver) {
		t.Logf("binary reports %s, den pins %s", ver, PinnedVersion)
	}
	// den's whole config: a raw root disk, the vsock, and a TAP of the
	// VM's own with its MAC (den's network makes the TAP and its address
	// before the VMM starts; the VMM opens it by name).
	disk := filepath.Join(files, "root.raw")
	must(t, "disk", os.WriteFile(disk, nil, 0o600))
	must(t, "disk size", os.Truncate(disk, 64<<20))
	if c.User != nil {
		must(t, "disk owner", c.User.Own(disk))
	}
	cfg := vmm.Config{
		CPUs:        1,
		MemoryBytes: 256 << 20,
		Kernel:      kernel,
		Initramfs:   initramfs,
		Cmdline:     "console=ttyS0 panic=-1 den.ip=10.254.0.2/30 den.gw=10.254.0.1 den.dns=10.254.0.1",
		Disks:       []vmm.Disk{{ID: "root", Path: disk}},
	}
	if tap := testTap(t); tap != "" {
		cfg.Net = []vmm.Net{{ID: "net0", Tap: tap, MAC: "02:de:00:00:00:01"}}
	}
	must(t, "create", v.Create(ctx, cfg))
	wantState(t, ctx, v, vmm.StateCreated)
	hostRefused(t, v, "boot", v.Boot(ctx))
	time.Sleep(time.Second) // let the guest get going
	info, err := v.Info(ctx)
	if err == nil && info.State != vmm.StateRunning {
		err = fmt.Errorf("state %s after boot", info.State)
	}
	if err != nil {
		err = fmt.Errorf("%w; console: %s", err, vmm.TailFile(v.opts.RunDir.ConsoleLog(), 300))
	}
	hostRefused(t, v, "running the guest", err)
	if info.MemoryBytes != cfg.MemoryBytes || info.CPUs != 1 {
		t.Errorf("info %+v", info)
	}
	hostRefused(t, v, "pause", v.Pause(ctx))
	wantState(t, ctx, v, vmm.StatePaused)
	snap := filepath.Join(files, "cp1")
	must(t, "mkdir", os.Mkdir(snap, 0o755))
	if c.User != nil {
		must(t, "snapshot dir owner", c.User.Own(snap))
	}
	hostRefused(t, v, "snapshot", v.Snapshot(ctx, snap))
	for _, f := range []string{"config.json", "state.json", "memory-ranges"} {
		if _, err := os.Stat(filepath.Join(snap, f)); err != nil {
			t.Errorf("snapshot: %v", err)
		}
	}
	must(t, "resume", v.Resume(ctx))
	wantState(t, ctx, v, vmm.StateRunning)
	must(t, "shutdown", v.Shutdown(ctx))
	waitExited(t, v, 10*time.Second)

	for _, onDemand := range []bool{false, true} {
		name := map[bool]string{false: "copy", true: "ondemand"}[onDemand]
		t.Run(name, func(t *testing.T) {
			r := New(opts(ownedDir(t, c)))
			t.Cleanup(func() { stopLeftover(t, r) })
			must(t, "start", r.Start(ctx))
			wantState(t, ctx, r, vmm.StateNotCreated)
			start := time.Now()
			rcfg := cfg
			hostRefused(t, r, "restore ("+name+")", r.Restore(ctx, snap, vmm.RestoreOptions{OnDemand: onDemand, Config: &rcfg}))
			t.Logf("restore %s: %s", name, time.Since(start).Round(time.Millisecond))
			wantState(t, ctx, r, vmm.StatePaused)
			must(t, "resume", r.Resume(ctx))
			wantState(t, ctx, r, vmm.StateRunning)
			must(t, "shutdown", r.Shutdown(ctx))
			waitExited(t, r, 10*time.Second)
		})
	}
}

// testTap makes a TAP device for the test (removed after it), "" where
// it cannot (not root).
func testTap(t *testing.T) string {
	if os.Geteuid() != 0 {
		t.Log("not root: the VM gets no TAP network device")
		return ""
	}
	name := fmt.Sprintf("dnchtest%d", os.Getpid()%10000)
	// Owned by nobody: the confined VMM opens it (realConfine).
	if out, err := exec.Command("ip", "tuntap", "add", "dev", name, "mode", "tap", "user", "nobody").CombinedOutput(); err != nil {
		t.Fatalf("ip tuntap add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
	if out, err := exec.Command("ip", "addr", "add", "10.254.0.1/30", "dev", name).CombinedOutput(); err != nil {
		t.Fatalf("address on %s: %v: %s", name, err, out)
	}
	return name
}

// realConfine is the confinement of the real-binary test: none but
// landlock unless root; as root, user nobody with group kvm (for
// /dev/kvm) in a cgroup of its own, removed after the test, and files
// made the user's.
func realConfine(t *testing.T, files string) vmm.Confine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Log("not root: the vmm runs as this user, in no cgroup of its own")
		return vmm.Confine{}
	}
	u, err := vmm.LookupUser("nobody")
	must(t, "user", err)
	if g, err := user.LookupGroup("kvm"); err == nil {
		gid, _ := strconv.Atoi(g.Gid)
		u.Groups = append(u.Groups, gid)
	}
	h, err := cgroup.Detect()
	must(t, "cgroups", err)
	g, err := h.Create(fmt.Sprintf("chtest-%d", os.Getpid()), cgroup.Limits{MemoryMax: 1 << 30, CPUQuota: 1, PidsMax: 256})
	must(t, "cgroup", err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Remove(ctx); err != nil {
			t.Error(err)
		}
	})
	must(t, "files owner", u.Own(files))
	must(t, "traverse", os.Chmod(filepath.Dir(files), 0o755))
	return vmm.Confine{User: u, Cgroup: g}
}

// ownedDir is a fresh run dir for the confined VMM.
func ownedDir(t *testing.T, c vmm.Confine) string {
	d := shortDir(t)
	if c.User != nil {
		must(t, "run dir owner", c.User.Own(d))
	}
	return d
}

// checkConfined reads from /proc that the VMM runs as the user, in its
// group, under seccomp.
func checkConfined(t *testing.T, pid int, c vmm.Confine) {
	t.Helper()
	if c.User == nil {
		return
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	must(t, "status", err)
	st := string(data)
	if !strings.Contains(st, fmt.Sprintf("\nUid:\t%d\t%d", c.User.UID, c.User.UID)) {
		t.Errorf("vmm does not run as %s:\n%s", c.User.Name, st)
	}
	// Cloud Hypervisor filters each of its threads: some must be.
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	filtered := false
	for _, f := range tasks {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), "\nSeccomp:\t2") {
			filtered = true
		}
	}
	if !filtered {
		t.Errorf("no thread of the vmm runs under a seccomp filter")
	}
	pids, err := c.Cgroup.Pids()
	if err != nil || !slices.Contains(pids, pid) {
		t.Errorf("vmm %d not in its cgroup: %v %v", pid, pids, err)
	}
}

// testKernel finds the guest kernel and initramfs, or says what is missing.
func testKernel() (kernel, initramfs, missing string) {
	if k := os.Getenv("DEN_TEST_KERNEL"); k != "" {
		if _, err := os.Stat(k); err != nil {
			return "", "", "DEN_TEST_KERNEL: " + err.Error()
		}
		return k, os.Getenv("DEN_TEST_INITRAMFS"), ""
	}
	dir := os.Getenv("DEN_IMAGE_DIR")
	if dir == "" {
		return "", "", "no guest kernel: set DEN_TEST_KERNEL (and DEN_TEST_INITRAMFS) or DEN_IMAGE_DIR (make image builds vmlinux and initramfs.img there)"
	}
	k, i := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initramfs.img")
	for _, f := range []string{k, i} {
		if _, err := os.Stat(f); err != nil {
			return "", "", "no guest kernel: " + err.Error() + " (make image builds it)"
		}
	}
	return k, i, ""
}

// hostRefused skips the test when err is this host refusing op, fails it
// on any other error, and does nothing without one.
func hostRefused(t *testing.T, v *VMM, op string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	msg := err.Error()
	reason := ""
	switch {
	case strings.Contains(msg, "GetNestedState"):
		reason = "its KVM does not return nested vCPU state (GetNestedState)"
	case strings.Contains(strings.ToLower(msg), "userfaultfd") || strings.Contains(msg, "uffd"):
		reason = "userfaultfd is not available to cloud-hypervisor (OnDemand restore needs it; see /proc/sys/vm/unprivileged_userfaultfd)"
	case fileExists("/sys/module/kvm_pvm"):
		reason = "/dev/kvm is PVM (kvm_pvm loaded), which runs only PVM-built guest kernels"
	}
	if reason == "" {
		t.Fatalf("%s: %v", op, err)
	}
	_ = v.Shutdown(testCtx(t, 30*time.Second))
	t.Skipf("host refuses %s: %s: %v", op, reason, err)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
