package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// diskUsage is what du counts under dir on dir's own filesystem (other
// mounts, such as the volume's FUSE mount and den's tmpfs, are left out),
// without the volume's local cache (JuiceFS caches the blocks the guest
// reads from its disk there, bounded by its cache size) and without the
// local copies of snapshots' memory (STATE/memory: copies den makes of
// its own accord, of a warm base after a create, of a VM's memory at a
// sleep or a checkpoint, bounded by --memory-copies).
func diskUsage(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "-x", "-B1", "--exclude=juicefs", "--exclude="+filepath.Join(dir, "memory"), dir).Output()
	if err != nil {
		t.Fatalf("du %s: %v", dir, err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGuestRAMInMemory: a guest that writes 1 GiB of its RAM makes the
// host write (close to) nothing to the state dir's disk: its RAM file is
// on den's tmpfs. Checkpoint, sleep, wake, restore and fork still work.
func TestGuestRAMInMemory(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "r", "--memory", "1536M", "--idle-timeout", "0")
	ram := filepath.Join(d.state, "ram", "r", "memory")
	var fs syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(ram), &fs); err != nil || fs.Type != 0x01021994 {
		t.Fatalf("guest RAM dir %s is not on a tmpfs (type %#x): %v", filepath.Dir(ram), fs.Type, err)
	}
	if _, err := os.Stat(filepath.Join(d.state, "run", "r", "memory")); err == nil {
		t.Fatal("a RAM file is in the state dir's run directory")
	}
	before := diskUsage(t, d.state)
	d.must("exec", "r", "--", "sh", "-c",
		"mkdir -p /mnt/r && mount -t tmpfs -o size=1100m none /mnt/r && dd if=/dev/zero of=/mnt/r/big bs=1M count=1024 2>/dev/null && sync && echo v1 > /root/file")
	var st syscall.Stat_t
	if err := syscall.Stat(ram, &st); err != nil {
		t.Fatal(err)
	}
	if held := st.Blocks * 512; held < 1<<30 {
		t.Fatalf("the RAM file holds %d MiB after the guest wrote 1 GiB: the guest did not touch it?", held>>20)
	}
	if grew := diskUsage(t, d.state) - before; grew > 64<<20 {
		t.Fatalf("the state dir's disk grew by %d MiB while the guest wrote 1 GiB of RAM", grew>>20)
	}
	d.must("exec", "r", "--", "sh", "-c", startWork)
	d.must("checkpoint", "r", "-m", "big RAM")
	d.must("sleep", "r")
	d.must("wake", "r")
	if out := d.must("exec", "r", "--", "sh", "-c", checkWork+"; ls -l /mnt/r/big | wc -l"); out != "v1\nalive\n1\n" {
		t.Fatalf("after sleep and wake: %q", out)
	}
	d.must("restore", "r", "cp-1", "--no-save")
	if out := d.must("exec", "r", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("after restore: %q", out)
	}
	d.must("fork", "r@cp-1", "r2")
	if out := d.must("exec", "r2", "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
		t.Fatalf("the fork: %q", out)
	}
	if _, err := os.Stat(filepath.Join(d.state, "ram", "r2", "memory")); err != nil {
		t.Fatalf("the fork's RAM file is not on the tmpfs: %v", err)
	}
	d.must("rm", "--force", "r2")
	if _, err := os.Stat(filepath.Join(d.state, "ram", "r2")); !os.IsNotExist(err) {
		t.Fatalf("rm left the fork's RAM behind: %v", err)
	}
}
