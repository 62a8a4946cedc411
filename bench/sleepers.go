package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// Sleeping VMs a host keeps for the scale figures (--quick: quickSleepers).
const (
	manySleepers  = 1000
	quickSleepers = 100
)

// sleepers measures a host that keeps many sleeping VMs: made cheaply, as
// the volume's metadata-only clones of one sleeping VM's files, each
// registered as a VM of its own while the daemon is down. Then, run after
// run, the daemon is stopped and started: how long until its API answers,
// how long `den ls` takes (its first listing after the start, and the
// next), and its resident memory against a daemon with one VM. The
// volume's inodes and the registry's rows per sleeping VM go in the
// notes. The clones go as they came, behind the daemon's back.
func (d *daemon) sleepers(ctx context.Context, o Options, v variant, accel string, figs []Figure, say func(string)) ([]Figure, error) {
	if v.compare {
		return figs, nil
	}
	n := manySleepers
	if o.Quick {
		n = quickSleepers
	}
	say(fmt.Sprintf("%d sleeping VMs: the first", n))
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: "seed", MemoryBytes: 256 << 20, IdleTimeout: "0"}, nil); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	if _, err := d.exec(ctx, "seed", "echo seed > /root/mark; sync"); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	if _, err := d.client.Sleep(ctx, "seed", api.SleepRequest{}); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	rss1, err := d.rss()
	if err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	if err := d.halt(); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	say(fmt.Sprintf("%d sleeping VMs: cloning and registering", n))
	names, inodes, err := d.cloneSleepers(ctx, "seed", n)
	defer d.dropSleepers(names)
	if err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	var starts, firstLs, nextLs []time.Duration
	var rss []float64
	for i := 0; i < o.Runs; i++ {
		say(fmt.Sprintf("%d sleeping VMs: daemon start and den ls (%d/%d)", n, i+1, o.Runs))
		if i > 0 {
			if err := d.halt(); err != nil {
				return figs, fmt.Errorf("sleepers: %w", err)
			}
		}
		t, err := d.restart(ctx)
		if err != nil {
			return figs, fmt.Errorf("sleepers: %w", err)
		}
		starts = append(starts, t)
		for j, into := range []*[]time.Duration{&firstLs, &nextLs} {
			var vms []api.VM
			t, err := timed(func() (err error) { vms, err = d.client.ListVMs(ctx); return err })
			if err != nil {
				return figs, fmt.Errorf("sleepers: den ls: %w", err)
			}
			if len(vms) != n+1 {
				return figs, fmt.Errorf("sleepers: den ls (%d) lists %d VMs, want %d", j+1, len(vms), n+1)
			}
			*into = append(*into, t)
		}
		r, err := d.rss()
		if err != nil {
			return figs, fmt.Errorf("sleepers: %w", err)
		}
		rss = append(rss, float64(r>>10))
	}
	if out, err := d.exec(ctx, names[n/2], "cat /root/mark"); err != nil || out != "seed\n" {
		return figs, fmt.Errorf("sleepers: a clone's file after its wake: %q, %v", out, err)
	}
	if _, err := d.client.Sleep(ctx, names[n/2], api.SleepRequest{}); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	label := fmt.Sprintf("%dx256M asleep", n)
	mem := Figure{Name: fmt.Sprintf("daemon RSS with %d sleeping VMs", n), VMM: d.vmm, Accel: accel, Memory: label, Unit: "KiB", Samples: rss,
		Note: fmt.Sprintf("%d KiB with one; %d volume inodes and 1 registry row per sleeping VM", rss1>>10, inodes)}
	mem.Median, mem.Min, mem.Max = stats(rss)
	return append(figs,
		figure(fmt.Sprintf("daemon start to API answering, %d sleeping VMs", n), d.vmm, accel, label, starts),
		figure(fmt.Sprintf("den ls of %d sleeping VMs, the first after a start", n), d.vmm, accel, label, firstLs),
		figure(fmt.Sprintf("den ls of %d sleeping VMs, the next", n), d.vmm, accel, label, nextLs),
		mem,
	), nil
}

// cloneSleepers clones VM seed's files on the volume n times and
// registers each clone as a sleeping VM of its own, the daemon being
// down. It returns the clones' names and how many inodes each holds.
func (d *daemon) cloneSleepers(ctx context.Context, seed string, n int) (names []string, inodes int, err error) {
	err = d.offline(ctx, func(db *registry.DB, vol *storage.JuiceFS) error {
		vm, err := db.GetVM(ctx, seed)
		if err != nil {
			return err
		}
		src, err := vol.Path(storage.VMDir(seed))
		if err != nil {
			return err
		}
		if err := filepath.WalkDir(src, func(string, fs.DirEntry, error) error { inodes++; return nil }); err != nil {
			return err
		}
		for i := range n {
			name := fmt.Sprintf("sleeper-%04d", i)
			if err := vol.Clone(ctx, storage.VMDir(seed), storage.VMDir(name)); err != nil {
				return err
			}
			names = append(names, name)
			clone := vm
			clone.Name, clone.Generation = name, 0
			if err := db.CreateVM(ctx, clone); err != nil {
				return fmt.Errorf("register %s: %w", name, err)
			}
		}
		return nil
	})
	return names, inodes, err
}

// dropSleepers removes the clones' records and files with the daemon
// down, and starts it again.
func (d *daemon) dropSleepers(names []string) {
	if len(names) == 0 || d.halt() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_ = d.offline(ctx, func(db *registry.DB, vol *storage.JuiceFS) error {
		for _, name := range names {
			_ = db.DeleteVM(ctx, name)
			_ = vol.Remove(ctx, storage.VMDir(name))
		}
		return nil
	})
	_, _ = d.restart(ctx)
}

// offline runs f on the stopped daemon's registry and volume (mounted
// for it, and unmounted after).
func (d *daemon) offline(ctx context.Context, f func(*registry.DB, *storage.JuiceFS) error) error {
	db, err := registry.Open(filepath.Join(d.dir, "state", "den.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	vol, err := storage.Open(ctx, storage.Config{StateDir: filepath.Join(d.dir, "state", "juicefs")})
	if err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = vol.Unmount(uctx)
	}()
	return f(db, vol)
}

// halt stops the daemon as a shutdown does (SIGTERM); its volume stays
// mounted, for the next daemon to adopt.
func (d *daemon) halt() error {
	if d.cmd.ProcessState != nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = d.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(2 * time.Minute):
		_ = d.cmd.Process.Kill()
		return fmt.Errorf("daemon did not stop within 2m")
	}
}

// restart starts the daemon again with the same command line, and times
// it until its API answers.
func (d *daemon) restart(ctx context.Context) (time.Duration, error) {
	start, err := d.relaunch()
	if err != nil {
		return 0, err
	}
	deadline := start.Add(5 * time.Minute)
	for {
		if _, err := d.client.Info(ctx); err == nil {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(d.dir, "daemon.log"))
			return 0, fmt.Errorf("daemon did not answer 5m after it started: %s", tail(log, 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relaunch starts the stopped daemon again with the same command line,
// its output appended to its log, and returns when it started.
func (d *daemon) relaunch() (time.Time, error) {
	logf, err := os.OpenFile(filepath.Join(d.dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return time.Time{}, err
	}
	defer logf.Close()
	cmd := exec.Command(d.cmd.Path, d.cmd.Args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return time.Time{}, err
	}
	d.cmd = cmd
	return start, nil
}

// rss is the daemon's resident memory, from /proc.
func (d *daemon) rss() (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in the daemon's status")
}
