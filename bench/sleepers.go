package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/cluster"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver, to count a cluster's rows
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
	defer func() { _ = d.client.RemoveVM(context.WithoutCancel(ctx), "seed", true) }() // after the clones
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
	if err := d.leaseGiven(ctx, o, "seed"); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	if err := d.halt(); err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	say(fmt.Sprintf("%d sleeping VMs: cloning and registering", n))
	names, cost, err := d.cloneSleepers(ctx, o, "seed", n)
	defer d.dropSleepers(o, names)
	if err != nil {
		return figs, fmt.Errorf("sleepers: %w", err)
	}
	var starts, firstLs, measured, nextLs []time.Duration
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
		ls := func() ([]api.VM, time.Duration, error) {
			var vms []api.VM
			t, err := timed(func() (err error) { vms, err = d.client.ListVMs(ctx); return err })
			if err != nil {
				return nil, 0, fmt.Errorf("sleepers: den ls: %w", err)
			}
			if want := n + 1 + len(d.others); len(vms) != want {
				return nil, 0, fmt.Errorf("sleepers: den ls lists %d VMs, want %d", len(vms), want)
			}
			return vms, t, nil
		}
		from := time.Now()
		vms, t1, err := ls()
		if err != nil {
			return figs, err
		}
		firstLs = append(firstLs, t1)
		// A listing waits only so long for the disks it measures: the
		// next listings find the figures as they come.
		// (A running VM of another host is measured at each listing.)
		for slices.ContainsFunc(vms, func(vm api.VM) bool { return vm.DiskUsedPending && vm.State != "running" }) {
			if time.Since(from) > 30*time.Minute {
				return figs, fmt.Errorf("sleepers: den ls still measures disks after 30m")
			}
			if vms, _, err = ls(); err != nil {
				return figs, err
			}
		}
		measured = append(measured, time.Since(from))
		_, t2, err := ls()
		if err != nil {
			return figs, err
		}
		nextLs = append(nextLs, t2)
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
		Note: fmt.Sprintf("%d KiB with one; %s", rss1>>10, cost)}
	mem.Median, mem.Min, mem.Max = stats(rss)
	return append(figs,
		figure(fmt.Sprintf("daemon start to API answering, %d sleeping VMs", n), d.vmm, accel, label, starts),
		figure(fmt.Sprintf("den ls of %d sleeping VMs, the first after a start", n), d.vmm, accel, label, firstLs),
		figure(fmt.Sprintf("den ls of %d sleeping VMs: from the first until no disk is being measured", n), d.vmm, accel, label, measured),
		figure(fmt.Sprintf("den ls of %d sleeping VMs, the next", n), d.vmm, accel, label, nextLs),
		mem,
	), nil
}

// cloneSleepers clones VM seed's files on the volume n times and
// registers each clone as a sleeping VM of its own, the daemon being
// down. It returns the clones' names and what each costs the volume and
// the databases.
func (d *daemon) cloneSleepers(ctx context.Context, o Options, seed string, n int) (names []string, cost sleeperCost, err error) {
	err = d.offline(ctx, o, func(db *registry.DB, vol *storage.JuiceFS, dbs []database) error {
		vm, err := db.GetVM(ctx, seed)
		if err != nil {
			return err
		}
		src, err := vol.Path(storage.VMDir(seed))
		if err != nil {
			return err
		}
		if err := filepath.WalkDir(src, func(string, fs.DirEntry, error) error { cost.inodes++; return nil }); err != nil {
			return err
		}
		before := make([]int64, len(dbs))
		for i, b := range dbs {
			if before[i], err = b.rows(ctx); err != nil {
				return err
			}
		}
		for i := range n {
			name := fmt.Sprintf("sleeper-%04d", i)
			if err := vol.Clone(ctx, storage.VMDir(seed), storage.VMDir(name)); err != nil {
				return err
			}
			clone := vm
			clone.Name, clone.Generation = name, 0
			if err := db.CreateVM(ctx, clone); err != nil {
				_ = vol.Remove(ctx, storage.VMDir(name))
				return fmt.Errorf("register %s: %w", name, err)
			}
			names = append(names, name)
		}
		for i, b := range dbs {
			after, err := b.rows(ctx)
			if err != nil {
				return err
			}
			cost.rows = append(cost.rows, fmt.Sprintf("%.1f %s rows", float64(after-before[i])/float64(n), b.what))
		}
		return nil
	})
	return names, cost, err
}

// sleeperCost is what one sleeping VM costs: the volume's inodes and,
// said in words, the rows of each database (den's registry and the
// volume's metadata).
type sleeperCost struct {
	inodes int
	rows   []string
}

func (c sleeperCost) String() string {
	return fmt.Sprintf("%d volume inodes, %s per sleeping VM", c.inodes, strings.Join(c.rows, ", "))
}

// dropSleepers removes the clones' records and files with the daemon
// down, and starts it again.
func (d *daemon) dropSleepers(o Options, names []string) {
	if len(names) == 0 || d.halt() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_ = d.offline(ctx, o, func(db *registry.DB, vol *storage.JuiceFS, _ []database) error {
		for _, name := range names {
			_ = db.DeleteVM(ctx, name)
			_ = vol.Remove(ctx, storage.VMDir(name))
		}
		return nil
	})
	_, _ = d.restart(ctx)
}

// leaseGiven waits, in a cluster, until the daemon gave vm's lease back
// after its sleep (once the memory's digests are written). A daemon that
// stops before keeps it, and another host takes the VM over as a lost
// host's once the lease lapsed, while the clones are made from its files.
func (d *daemon) leaseGiven(ctx context.Context, o Options, vm string) error {
	if o.Cluster == "" {
		return nil
	}
	cc, err := cluster.Load(o.Cluster, "bench", machine.StateDir(filepath.Join(d.dir, "state")).VolumeState())
	if err != nil {
		return err
	}
	db, err := registry.OpenPostgres(ctx, cc.RegistryDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	given := poll.Until(2*time.Minute, func() bool {
		var l registry.Lease
		l, err = db.GetLease(ctx, vm)
		return err == nil && !l.Held() || ctx.Err() != nil
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	if !given {
		return fmt.Errorf("vm %q: its lease still held 2m after its sleep (%v)", vm, err)
	}
	return nil
}

// offline runs f on the stopped daemon's registry and volume (mounted
// for it, and unmounted after): the cluster's when it joined one
// (Options.Cluster). dbs are the databases the two keep their records in.
func (d *daemon) offline(ctx context.Context, o Options, f func(reg *registry.DB, vol *storage.JuiceFS, dbs []database) error) error {
	state := machine.StateDir(filepath.Join(d.dir, "state"))
	vcfg := storage.Config{StateDir: state.VolumeState()}
	dbs := []database{
		{what: "registry", driver: "sqlite", dsn: "file:" + state.DB()},
		{what: "volume metadata", driver: "sqlite", dsn: "file:" + filepath.Join(vcfg.StateDir, "meta.db")},
	}
	open := func() (*registry.DB, error) { return registry.Open(state.DB()) }
	if o.Cluster != "" {
		cc, err := cluster.Load(o.Cluster, "bench", vcfg.StateDir)
		if err != nil {
			return err
		}
		vcfg = cc.Volume
		meta, err := url.Parse(cc.Volume.MetaURL)
		if err != nil {
			return fmt.Errorf("volume meta_url: %w", err)
		}
		if pw := cc.Volume.Secrets.MetaPassword; pw != "" {
			meta.User = url.UserPassword(meta.User.Username(), pw)
		}
		dbs = []database{{what: "registry", driver: "pgx", dsn: cc.RegistryDSN()}, {what: "volume metadata", driver: "pgx", dsn: meta.String()}}
		open = func() (*registry.DB, error) { return registry.OpenPostgres(ctx, cc.RegistryDSN()) }
	}
	db, err := open()
	if err != nil {
		return err
	}
	defer db.Close()
	vol, err := storage.Open(ctx, vcfg)
	if err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = vol.Unmount(uctx)
	}()
	return f(db, vol, dbs)
}

// database is a database a scale run counts rows in.
type database struct {
	what   string
	driver string // database/sql's: "sqlite" or "pgx"
	dsn    string
}

// rows counts the rows of every table in the database's schema.
func (b database) rows(ctx context.Context) (int64, error) {
	db, err := sql.Open(b.driver, b.dsn)
	if err != nil {
		return 0, fmt.Errorf("count %s rows: %w", b.what, err)
	}
	defer db.Close()
	q := `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`
	if b.driver == "pgx" {
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`
	}
	tables, err := db.QueryContext(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("count %s rows: %w", b.what, err)
	}
	var names []string
	for tables.Next() {
		var name string
		if err := tables.Scan(&name); err != nil {
			tables.Close()
			return 0, fmt.Errorf("count %s rows: %w", b.what, err)
		}
		names = append(names, name)
	}
	tables.Close()
	if err := tables.Err(); err != nil {
		return 0, fmt.Errorf("count %s rows: %w", b.what, err)
	}
	var total int64
	for _, name := range names {
		var n int64
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM "`+name+`"`).Scan(&n); err != nil {
			return 0, fmt.Errorf("count %s rows: table %s: %w", b.what, name, err)
		}
		total += n
	}
	return total, nil
}

// halt stops the daemon as a shutdown does (SIGTERM); its volume stays
// mounted, for the next daemon to adopt.
func (d *daemon) halt() error {
	select {
	case <-d.exited:
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
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
	t, err := d.answering(ctx, start, 5*time.Minute)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(d.dir, "daemon.log"))
		return 0, fmt.Errorf("restart: %w: %s", err, tail(log, 2000))
	}
	return t, nil
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
	d.watchExit()
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
