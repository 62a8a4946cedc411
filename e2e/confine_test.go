package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/cgroup"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/vmm/qemu"
)

// confinedVM is what the test reads of a running VM's VMM from /proc
// and the cgroup filesystem.
type confinedVM struct {
	t       *testing.T
	pid     int
	version int    // cgroup version
	name    string // VM (cgroup) name
}

// file is the path of a cgroup interface file of the VM's group: on v1
// in the controller's hierarchy, on v2 in den's slice.
func (c confinedVM) file(ctrl, name string) string {
	if c.version == 2 {
		return filepath.Join(cgroup.Root, cgroup.ParentV2, c.name, name)
	}
	return filepath.Join(cgroup.Root, ctrl, cgroup.ParentV1, c.name, name)
}

func (c confinedVM) read(ctrl, name string) int64 {
	c.t.Helper()
	data, err := os.ReadFile(c.file(ctrl, name))
	if err != nil {
		c.t.Fatal(err)
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		c.t.Fatalf("%s is empty", c.file(ctrl, name))
	}
	if f[0] == "usage_usec" && len(f) > 1 { // v2 cpu.stat
		f = f[1:]
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		c.t.Fatalf("%s: %v", c.file(ctrl, name), err)
	}
	return n
}

// status is a field of /proc/PID/status.
func (c confinedVM) status(field string) string {
	c.t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.pid))
	if err != nil {
		c.t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// cpuSeconds is the group's CPU time so far.
func (c confinedVM) cpuSeconds() float64 {
	if c.version == 2 {
		return float64(c.read("", "cpu.stat")) / 1e6
	}
	return float64(c.read("cpuacct", "cpuacct.usage")) / 1e9
}

// TestConfinedVMM: a VM's QEMU runs as den-vm, under its seccomp
// sandbox, in a cgroup of its own with the VM's limits from its start;
// a guest that allocates past its RAM is OOM-killed inside the guest
// without taking the VMM past its memory limit; --cpus 1 caps the VMM's
// CPU; the guest cannot reach the host's loopback through 10.0.2.2; and
// the group goes with the VMM (sleep) and comes back with it (wake).
func TestConfinedVMM(t *testing.T) {
	d := startDaemon(t)
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const mem = 512 << 20
	// Cold: a booted guest's RAM is touched by QEMU itself, so charged
	// to its group (a restored one's copy is charged to the daemon).
	d.must("create", "box", "--memory", "512M", "--cpus", "1", "--cold")
	vm := d.info("box")
	u, err := user.Lookup("den-vm")
	if err != nil {
		t.Fatalf("the daemon did not make the vmm user: %v", err)
	}
	c := confinedVM{t: t, pid: vm.PID, version: h.Version()}

	// Who and how it runs.
	if got, want := c.status("Uid"), strings.Repeat(u.Uid+" ", 3)+u.Uid; got != want {
		t.Errorf("qemu Uid %q, want %q (den-vm)", got, want)
	}
	if got := c.status("Seccomp"); got != "2" {
		t.Errorf("qemu Seccomp %q, want 2 (filter)", got)
	}
	if got := c.status("CapEff"); got != "0000000000000000" {
		t.Errorf("qemu has capabilities %s", got)
	}
	// The group is the VM's name after the daemon's id.
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", vm.PID))
	if err != nil {
		t.Fatal(err)
	}
	parent := "/" + cgroup.ParentV1 + "/"
	if c.version == 2 {
		parent = "/" + cgroup.ParentV2 + "/"
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || (c.version == 1) != slices.Contains(strings.Split(f[1], ","), "memory") {
			continue
		}
		if g, ok := strings.CutPrefix(f[2], parent); ok && strings.HasSuffix(g, "-box") {
			c.name = g
		}
	}
	if c.name == "" {
		t.Fatalf("qemu %d is in no group of den's for box:\n%s", vm.PID, data)
	}

	// The limits.
	overhead := int64(machine.DefaultCgroupOverhead)
	if vm.Accel == "tcg" {
		overhead += qemu.TCGCacheMiB << 20
	}
	if c.version == 1 {
		if got := c.read("memory", "memory.limit_in_bytes"); got != mem+overhead {
			t.Errorf("memory limit %d, want %d", got, mem+overhead)
		}
		if q, p := c.read("cpu", "cpu.cfs_quota_us"), c.read("cpu", "cpu.cfs_period_us"); q != p {
			t.Errorf("cpu quota %d per %d, want one core", q, p)
		}
	} else if got := c.read("memory", "memory.max"); got != mem+overhead {
		t.Errorf("memory.max %d, want %d", got, mem+overhead)
	}
	if got := c.read("pids", "pids.max"); got != 256 {
		t.Errorf("pids.max %d, want 256", got)
	}

	t.Run("guest oom", func(t *testing.T) {
		// tail keeps the last line of a stream without newlines: its
		// buffer grows, a realloc at a time, past the guest's RAM until
		// the guest's OOM killer ends it.
		out, err := d.run("exec", "box", "--", "sh", "-c", "dd if=/dev/zero bs=1M count=900 2>/dev/null | tr '\\000' a | tail -n 1 | wc -c")
		t.Logf("allocation in the guest: %q %v", out, err)
		if strings.TrimSpace(out) == "943718400" {
			t.Fatal("the guest held 900M in 512M of RAM")
		}
		if got := d.info("box"); got.State != "running" || got.PID != vm.PID {
			t.Fatalf("after the guest's oom: %+v (was pid %d)", got, vm.PID)
		}
		if out := d.must("exec", "box", "--", "echo", "alive"); out != "alive\n" {
			t.Fatalf("guest after oom: %q", out)
		}
		if c.version == 1 {
			peak := c.read("memory", "memory.max_usage_in_bytes")
			t.Logf("vmm cgroup peak %d MiB: guest RAM + %d MiB (limit: guest RAM + %d MiB), failcnt %d",
				peak>>20, (peak-mem)>>20, overhead>>20, c.read("memory", "memory.failcnt"))
			if peak > mem+overhead {
				t.Fatalf("peak %d over the limit %d", peak, mem+overhead)
			}
			if peak < mem/2 {
				t.Fatalf("peak %d MiB: the guest did not fill its RAM (%q, %v)", peak>>20, out, err)
			}
		}
	})

	t.Run("cpu capped", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := d.run("exec", "box", "--", "sh", "-c", "timeout 12 sh -c 'while :; do :; done'; true")
			done <- err
		}()
		start, startCPU := time.Now(), c.cpuSeconds()
		// A measurement window, not a wait for a condition.
		select {
		case err := <-done:
			t.Fatalf("busy loop ended early: %v", err)
		case <-time.After(6 * time.Second):
		}
		used := (c.cpuSeconds() - startCPU) / time.Since(start).Seconds()
		t.Logf("vmm used %.2f cores with a busy 1-vCPU guest under --cpus 1", used)
		if used > 1.25 {
			t.Errorf("vmm used %.2f cores, cap is 1", used)
		}
		if used < 0.3 {
			t.Errorf("vmm used %.2f cores: the guest was not busy", used)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("host loopback", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		reached := make(chan struct{}, 1)
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(conn, "host-secret")
				conn.Close()
				reached <- struct{}{}
			}
		}()
		port := l.Addr().(*net.TCPAddr).Port
		out, _ := d.run("exec", "box", "--", "sh", "-c", fmt.Sprintf("timeout 10 nc 10.0.2.2 %d </dev/null 2>&1; echo rc=$?", port))
		if strings.Contains(out, "host-secret") || len(reached) > 0 {
			t.Fatalf("the guest reached the host's loopback through 10.0.2.2: %q", out)
		}
		if !strings.Contains(out, "rc=") {
			t.Fatalf("nc in the guest: %q", out)
		}
		t.Logf("guest to 10.0.2.2:%d: %q", port, out)
	})

	t.Run("sleep and wake", func(t *testing.T) {
		d.must("sleep", "box")
		if _, err := os.Stat(c.file("memory", "")); !os.IsNotExist(err) {
			t.Errorf("the cgroup outlived its vmm: %v", err)
		}
		d.must("wake", "box")
		w := d.info("box")
		c2 := c
		c2.pid = w.PID
		if got := c2.status("Seccomp"); got != "2" {
			t.Errorf("woken qemu Seccomp %q", got)
		}
		procs, err := os.ReadFile(c.file("memory", "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(strings.NewReader(string(procs)))
		found := false
		for sc.Scan() {
			found = found || sc.Text() == strconv.Itoa(w.PID)
		}
		if !found {
			t.Errorf("woken qemu %d not in its group: %q", w.PID, procs)
		}
		if out := d.must("exec", "box", "--", "echo", "awake"); out != "awake\n" {
			t.Fatalf("after wake: %q", out)
		}
	})
}
