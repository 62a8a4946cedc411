package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/storage"
)

// sleepers is how many sleeping VMs TestThousandSleepingVMs keeps.
const sleepers = 1000

// TestThousandSleepingVMs: a host keeps a thousand sleeping VMs as an
// ordinary day. They are made cheaply: the volume's metadata-only clones
// of one sleeping VM's files, each registered as a VM of its own, while
// the daemon is down. The daemon then starts with all of them, lists
// them, wakes one (a real guest, with the file its origin wrote), and its
// memory grows by little per sleeping VM. How long the start and the
// listing took is logged; make bench measures them.
func TestThousandSleepingVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest")
	}
	d := startDaemon(t)
	d.must("create", "seed", "--memory", "128M", "--idle-timeout", "0")
	d.must("exec", "seed", "--", "sh", "-c", "echo from-seed > /root/mark; sync")
	d.must("sleep", "seed")
	rss1 := d.rss()

	d.kill()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	db := d.registry()
	seed, err := db.GetVM(ctx, "seed")
	if err != nil {
		t.Fatal(err)
	}
	mnt := d.volumeMount()
	began := time.Now()
	names := make([]string, sleepers)
	for i := range names {
		names[i] = fmt.Sprintf("s-%04d", i)
		src, dst := filepath.Join(mnt, string(storage.VMDir("seed"))), filepath.Join(mnt, string(storage.VMDir(names[i])))
		if err := storage.ControlClone(ctx, mnt, src, dst); err != nil {
			t.Fatalf("clone the seed's files for %s: %v", names[i], err)
		}
		vm := seed
		vm.Name, vm.Generation = names[i], 0
		if err := db.CreateVM(ctx, vm); err != nil {
			t.Fatalf("register %s: %v", names[i], err)
		}
	}
	t.Logf("%d sleeping VMs cloned and registered in %s", sleepers, time.Since(began).Round(time.Millisecond))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	began = time.Now()
	d.start() // it answers once its start is over
	t.Logf("daemon start with %d VMs: %s", sleepers+1, time.Since(began).Round(time.Millisecond))
	// The first listing measures the disks the daemon has not measured
	// yet (the clones were registered behind its back), waiting for
	// them only so long; the next listings find the figures as they
	// come, and once none is being measured, every disk has its own.
	began = time.Now()
	d.must("ls")
	t.Logf("den ls of %d VMs, the first: %s", sleepers+1, time.Since(began).Round(time.Millisecond))
	var vms []vmJSON
	list := func() {
		vms = nil
		if err := json.Unmarshal([]byte(d.must("ls", "--json")), &vms); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForWithin(t, 10*time.Minute, "a listing with no disk being measured", func() bool {
		list()
		return !slices.ContainsFunc(vms, func(vm vmJSON) bool { return vm.DiskPending })
	})
	t.Logf("den ls of %d VMs: no disk being measured %s after the first", sleepers+1, time.Since(began).Round(time.Millisecond))
	began = time.Now()
	list()
	t.Logf("den ls of %d VMs, the next: %s", sleepers+1, time.Since(began).Round(time.Millisecond))
	for _, vm := range vms {
		if vm.DiskUsed <= 0 || vm.DiskPending {
			t.Fatalf("den ls: %s's disk: %d bytes, pending %v", vm.Name, vm.DiskUsed, vm.DiskPending)
		}
	}
	asleep := 0
	for _, vm := range vms {
		if vm.State == "sleeping" {
			asleep++
		}
	}
	if len(vms) != sleepers+1 || asleep != sleepers+1 {
		t.Fatalf("den ls: %d VMs, %d asleep; want %d, all asleep", len(vms), asleep, sleepers+1)
	}
	rss := d.rss()
	perVM := (rss - rss1) / sleepers
	t.Logf("daemon RSS: %d KiB with one VM, %d KiB with %d: %d bytes per sleeping VM", rss1>>10, rss>>10, sleepers+1, perVM)
	// A few KiB each is the goal; the bound leaves room for the Go
	// heap's own growth, which a thousand records' reading causes.
	if perVM > 64<<10 {
		t.Fatalf("the daemon holds %d bytes per sleeping VM", perVM)
	}

	// One of them is a real VM: it wakes with what its origin wrote.
	if got := d.must("exec", names[sleepers/2], "--", "cat", "/root/mark"); got != "from-seed\n" {
		t.Fatalf("a clone's file: %q", got)
	}
	d.must("sleep", names[sleepers/2])

	// The clones go as they came, behind the daemon's back, so that the
	// teardown removes one VM, not a thousand.
	d.kill()
	db = d.registry()
	defer db.Close()
	for _, name := range names {
		if err := db.DeleteVM(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(mnt, string(storage.VMDir(name)))); err != nil {
			t.Fatal(err)
		}
	}
	d.start()
}

// rss is the daemon's resident memory, from /proc.
func (d *daemon) rss() int64 {
	d.t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		d.t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				d.t.Fatal(err)
			}
			return kib << 10
		}
	}
	d.t.Fatal("no VmRSS in the daemon's status")
	return 0
}
