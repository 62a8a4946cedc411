package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestStrangerReadsDuringSleep: another user's `den info` (and den ls,
// the owner's own reads) racing sleeps and wakes neither reveal the VM
// nor change its state, and the VM is never cold-booted: its background
// process survives every wake.
func TestStrangerReadsDuringSleep(t *testing.T) {
	d := startDaemon(t)
	d.reachableBy()
	alice, bob := localUser(t, "den-alice"), localUser(t, "den-bob")
	d.mustAs(alice, "create", "nap", "--memory", "256M", "--idle-timeout", "0")
	d.mustAs(alice, "exec", "nap", "--", "sh", "-c", startWork)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var polls, bad atomic.Int64
	var badLine atomic.Value
	poll := func(u osUser, args ...string) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			out, err := d.runAs(u, args...)
			polls.Add(1)
			if strings.Contains(out, "vmm process not found") || strings.Contains(out, `"stopped"`) {
				bad.Add(1)
				badLine.Store(out)
			}
			if u == bob && (err == nil || !strings.Contains(stderrOf(err), `no vm named "nap"`)) {
				bad.Add(1)
				badLine.Store(fmt.Sprintf("stranger saw: %q %v", out, err))
			}
		}
	}
	wg.Add(3)
	go poll(bob, "info", "nap", "--json")
	go poll(alice, "info", "nap", "--json")
	go poll(alice, "ls", "--json")
	for i := 0; i < 4; i++ {
		d.mustAs(alice, "sleep", "nap")
		if vm := d.info("nap"); vm.State != "sleeping" {
			t.Fatalf("after sleep %d: %+v", i, vm)
		}
		// Polls made while it slept see it asleep.
		n := polls.Load()
		deadline := time.Now().Add(time.Minute)
		for polls.Load() < n+6 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if vm := d.info("nap"); vm.State != "sleeping" {
			t.Fatalf("reads during sleep %d changed it: %+v", i, vm)
		}
		d.mustAs(alice, "wake", "nap")
	}
	close(stop)
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d of %d polls were wrong, e.g. %v", bad.Load(), polls.Load(), badLine.Load())
	}
	if out := d.mustAs(alice, "exec", "nap", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after sleeps raced by reads: %q (cold-booted?)", out)
	}
	t.Logf("%d polls raced 4 sleep/wake cycles", polls.Load())
}

// TestSecondDaemonRefused: a second daemon on the same state dir refuses
// with one clear line, and the first keeps working.
func TestSecondDaemonRefused(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "one", "--memory", "256M")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.den, "daemon", "--state-dir", d.state, "--socket", d.socket+"2",
		"--images", d.images.Path(), "--ssh-listen", "off")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another den daemon") || !strings.Contains(string(out), "uses state dir") {
		t.Fatalf("second daemon: %v\n%s", err, out)
	}
	if out := d.must("exec", "one", "--", "echo", "fine"); out != "fine\n" {
		t.Fatalf("first daemon after the refusal: %q", out)
	}
}

// TestMountKilled: kill -9 of the JuiceFS mount leaves no VM running on
// the dead disk: the VM is recorded stopped with what happened, and its
// next use boots it on the remounted volume with the data it had synced.
func TestMountKilled(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "m", "--memory", "256M", "--idle-timeout", "0")
	d.must("exec", "m", "--", "sh", "-c", "echo kept > /root/kept; sync")
	for _, pid := range juicefsMountPIDs(t, d.state) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	var vm vmJSON
	for time.Now().Before(deadline) {
		vm = d.info("m")
		if vm.State == "stopped" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if vm.State != "stopped" || !strings.Contains(vm.Reason, "storage volume") {
		t.Fatalf("after the mount died: %+v", vm)
	}
	if out := d.must("exec", "m", "--", "cat", "/root/kept"); out != "kept\n" {
		t.Fatalf("data synced before the mount died: %q", out)
	}
	if vm := d.info("m"); vm.State != "running" {
		t.Fatalf("after the restart: %+v", vm)
	}
}

// juicefsMountPIDs finds the juicefs mount processes of a state dir (its
// supervisor and the service process it runs). JuiceFS rewrites its
// argv into one space-separated string.
func juicefsMountPIDs(t *testing.T, state string) []int {
	t.Helper()
	pids := pidsWhere(func(cmdline []byte) bool {
		f := strings.Fields(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		return len(f) > 2 && strings.HasSuffix(f[0], "juicefs") && slices.Contains(f, "mount") && strings.Contains(string(cmdline), state+"/")
	})
	if len(pids) == 0 {
		t.Fatal("no juicefs mount process for " + state)
	}
	return pids
}

// TestFailedForkLeavesNothing: a fork onto an existing name takes no
// checkpoint and does not move the source's head.
func TestFailedForkLeavesNothing(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "a", "--memory", "256M")
	d.must("create", "b", "--memory", "256M")
	d.must("checkpoint", "a", "-m", "first")
	_, err := d.run("fork", "a", "b")
	if exitCode(err) == 0 || !strings.Contains(stderrOf(err), "exists") {
		t.Fatalf("fork onto an existing name: %v", err)
	}
	cps := d.checkpoints("a")
	if len(cps) != 1 || cps[0].ID != "cp-1" || !cps[0].Head {
		t.Fatalf("checkpoints after a refused fork: %+v", cps)
	}
}

// TestDiskSizeInGuest: --disk is the size the guest's root filesystem
// has, for warm and cold creates, and den resize grows it live.
func TestDiskSizeInGuest(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "warm", "--memory", "256M", "--disk", "2G")
	d.must("create", "cold", "--memory", "256M", "--disk", "2G", "--cold")
	for _, name := range []string{"warm", "cold"} {
		// ext4 keeps a few percent for its metadata.
		if kib := rootKiB(t, d, name); kib < 1850<<10 || kib > 2048<<10 {
			t.Errorf("%s: df / says %d KiB, want about 2 GiB", name, kib)
		}
	}
	d.must("resize", "warm", "--disk", "3G")
	if kib := rootKiB(t, d, "warm"); kib < 2800<<10 || kib > 3072<<10 {
		t.Errorf("after resize: df / says %d KiB, want about 3 GiB", kib)
	}
	// The grown filesystem survives a sleep and a cold boot.
	d.must("sleep", "warm")
	if kib := rootKiB(t, d, "warm"); kib < 2800<<10 {
		t.Errorf("after sleep and wake: %d KiB", kib)
	}
}

// rootKiB is the size of the guest's root filesystem (df -k /).
func rootKiB(t *testing.T, d *daemon, name string) int64 {
	t.Helper()
	out := d.must("exec", name, "--", "df", "-k", "/")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 2 {
		t.Fatalf("df: %q", out)
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df: %q", out)
	}
	return n
}

// TestForkIdentity: forks from memory+disk and from disk-only checkpoints
// both get their own hostname, machine-id, agent host key and MAC.
func TestForkIdentity(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "src", "--memory", "256M")
	d.must("checkpoint", "src", "--disk-only")
	d.must("checkpoint", "src")
	d.must("fork", "src@cp-1", "disk")
	d.must("fork", "src@cp-2", "mem")
	const ident = "hostname; cat /etc/machine-id; cat /etc/den/ssh_host_ed25519_key | sha256sum; cat /sys/class/net/eth0/address"
	seen := map[string]string{}
	for _, vm := range []string{"src", "disk", "mem"} {
		lines := strings.Split(strings.TrimSpace(d.must("exec", vm, "--", "sh", "-c", ident)), "\n")
		if len(lines) != 4 || lines[0] != vm {
			t.Fatalf("%s: identity %q", vm, lines)
		}
		for i, what := range []string{"hostname", "machine-id", "host key", "mac"} {
			if other, ok := seen[what+lines[i]]; ok {
				t.Errorf("%s and %s share the %s %s", vm, other, what, lines[i])
			}
			seen[what+lines[i]] = vm
		}
	}
	// A cold boot of a fork keeps its identity.
	before := d.must("exec", "disk", "--", "sh", "-c", ident)
	d.must("rm", "--force", "src")
	d.must("checkpoint", "disk", "--disk-only")
	d.must("restore", "disk", "cp-1", "--no-save")
	if after := d.must("exec", "disk", "--", "sh", "-c", ident); after != before {
		t.Fatalf("identity changed across a cold boot: %q -> %q", before, after)
	}
}

// TestHostVolumeFull: with the host volume full, a checkpoint fails at
// once with a line that says so, and no checkpoint is listed. The state
// dir (and the embedded volume under it) is on a small tmpfs of its own,
// so that filling it touches nothing else on the host.
func TestHostVolumeFull(t *testing.T) {
	d := startDaemonIn(t, func(dir string) []string {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1536m", "den-e2e-full", dir).CombinedOutput(); err != nil {
			t.Fatalf("mount a tmpfs: %v %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
		return nil
	})
	d.must("create", "f", "--memory", "256M", "--disk", "512M", "--idle-timeout", "0")
	// Fill the tmpfs to about 40 MB free: less than any snapshot needs.
	// The guest's RAM file and JuiceFS's cache share it and may grow
	// meanwhile, so fill in steps, halving a step the tmpfs refuses.
	fillers := fillTo(t, d.state, 40<<20)
	start := time.Now()
	_, err := d.run("checkpoint", "f")
	if exitCode(err) == 0 || !strings.Contains(stderrOf(err), "host volume full") {
		t.Fatalf("checkpoint on a full volume: %v", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the refusal took %s", took)
	}
	if _, err := d.run("sleep", "f"); exitCode(err) == 0 || !strings.Contains(stderrOf(err), "host volume full") {
		t.Fatalf("sleep on a full volume: %v", err)
	}
	if cps := d.checkpoints("f"); len(cps) != 0 {
		t.Fatalf("a refused checkpoint is listed: %+v", cps)
	}
	for _, f := range fillers {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	d.must("checkpoint", "f")
	if out := d.must("exec", "f", "--", "echo", "fine"); out != "fine\n" {
		t.Fatalf("vm after a full volume: %q", out)
	}
}

// TestBadFlagsAndSizes: unknown flags and sizes that are not a whole
// number of MiB are refused with one line, and nothing is made.
func TestBadFlagsAndSizes(t *testing.T) {
	d := startDaemon(t)
	for _, args := range [][]string{
		{"create", "x", "--memroy", "2G"},
		{"create", "x", "--memory", "NaN"},
		{"create", "x", "--disk", "NaN"},
		{"create", "x", "--disk", "0.5"},
		{"create", "x", "--disk", "-1G"},
	} {
		_, err := d.run(args...)
		msg := stderrOf(err)
		if exitCode(err) == 0 || strings.Count(msg, "\n") > 0 || msg == "" {
			t.Errorf("den %s: exit %d, %q", strings.Join(args, " "), exitCode(err), msg)
		}
	}
	var vms []vmJSON
	if err := json.Unmarshal([]byte(d.must("ls", "--json")), &vms); err != nil || len(vms) != 0 {
		t.Fatalf("after refused creates: %+v %v", vms, err)
	}
}

// fillTo writes filler files beside dir until its filesystem has at most
// target bytes free (bounded: at most 64 files), and returns them.
func fillTo(t *testing.T, dir string, target int64) []string {
	t.Helper()
	var files []string
	for i := 0; i < 64; i++ {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		free := int64(st.Bavail) * st.Bsize
		if free <= target+1<<20 {
			return files
		}
		f := filepath.Join(filepath.Dir(dir), fmt.Sprintf("filler-%d", i))
		for n := free - target; n >= 1<<20; n /= 2 {
			if exec.Command("fallocate", "-l", strconv.FormatInt(n, 10), f).Run() == nil {
				files = append(files, f)
				break
			}
			_ = os.Remove(f)
		}
	}
	t.Fatalf("could not fill %s to %d bytes free", dir, target)
	return nil
}
