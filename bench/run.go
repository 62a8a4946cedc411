package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/storage"
)

// daemon is the den daemon a benchmark runs against.
type daemon struct {
	dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	// others are the VMs it found at its start (other hosts', in a
	// cluster).
	others map[string]bool
	// cluster: it is a host of a cluster (Options.Cluster), where stop
	// removes no VM (another host may have made it meanwhile): each
	// measure removes its own.
	cluster bool
	client  *api.Client
	version string
	vmm     string
	traces  traces // the daemon's traces of timed operations (breakdown.go)
	floor   *floor // sampled between the figures set against it, if any
	// opCPU is the host's CPU time over the operation timed last, for
	// its breakdown (-1: none, or unknown).
	opCPU float64
}

// timed times f, and the host's CPU time over it into d.opCPU.
func (d *daemon) timed(f func() error) (time.Duration, error) {
	span := startCPU()
	t, err := timed(f)
	d.opCPU = span.ms()
	return t, err
}

// startDaemon starts `den daemon` for one VMM on a fresh state dir, with
// the gateway on a free loopback port.
func startDaemon(ctx context.Context, o Options, v variant) (*daemon, error) {
	dir, err := os.MkdirTemp("/tmp", "den-bench-")
	if err != nil {
		return nil, err
	}
	// The VMMs' user (den-vm) goes through to the state dir, as through
	// /var/lib.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	d := &daemon{dir: dir, vmm: v.name, opCPU: -1, cluster: o.Cluster != ""}
	sock := filepath.Join(dir, "den.sock")
	logf, err := os.Create(filepath.Join(dir, "daemon.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{"daemon", "--state-dir", filepath.Join(dir, "state"), "--socket", sock,
		"--images", o.Images, "--default-image", o.Image, "--vmm", v.vmm, "--ssh-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--gc-grace", "2s"} // the collection's figure collects what the run just made
	if !slices.Contains(v.flags, "--net") {
		args = append(args, "--net", "user") // the host's network stays as it is (network.go has its own)
	}
	for _, f := range v.flags {
		args = append(args, strings.ReplaceAll(f, "{state}", filepath.Join(dir, "state")))
	}
	if o.Cluster != "" {
		args = append(args, "--cluster", o.Cluster)
	}
	d.cmd = exec.Command(o.Den, args...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	d.watchExit()
	d.client = api.NewClient(sock)
	if _, err := d.answering(ctx, time.Now(), 2*time.Minute); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "daemon.log")) // before stop removes it
		d.stop()
		return nil, fmt.Errorf("daemon did not start: %w: %s", err, tail(log, 2000))
	}
	vms, err := d.client.ListVMs(ctx)
	if err != nil {
		d.stop()
		return nil, err
	}
	d.others = map[string]bool{}
	for _, vm := range vms {
		d.others[vm.Name] = true
	}
	d.version = vmmVersion(v.vmm)
	return d, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// vmmVersion is the first line of the VMM's --version.
func vmmVersion(vmmName string) string {
	bin := "qemu-system-x86_64"
	if vmmName == "cloud-hypervisor" {
		bin = "cloud-hypervisor"
		if b := os.Getenv("DEN_CH_BINARY"); b != "" {
			bin = b
		}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// stop removes every VM (none in a cluster) and stops the daemon (which
// unmounts the volume).
func (d *daemon) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if vms, err := d.client.ListVMs(ctx); err == nil && !d.cluster {
		for _, vm := range vms {
			_ = d.client.RemoveVM(ctx, vm.Name, true)
		}
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		_ = syscall.Unmount(filepath.Join(d.dir, "state", "ram"), syscall.MNT_DETACH) // den's tmpfs for guest RAM
		_ = os.RemoveAll(d.dir)
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
	}
}

// watchExit closes d.exited once d.cmd, just started, exits.
func (d *daemon) watchExit() {
	exited, cmd := make(chan struct{}), d.cmd
	d.exited = exited
	go func() { _ = cmd.Wait(); close(exited) }()
}

// answering waits, up to limit, until the daemon started at start
// answers on its API, and says how long that took; a daemon that exits
// meanwhile fails it at once.
func (d *daemon) answering(ctx context.Context, start time.Time, limit time.Duration) (time.Duration, error) {
	deadline := start.Add(limit)
	for {
		if _, err := d.client.Info(ctx); err == nil {
			return time.Since(start), nil
		}
		select {
		case <-d.exited:
			return 0, fmt.Errorf("the daemon exited (%v)", d.cmd.ProcessState)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the daemon did not answer within %s", limit)
		}
	}
}

// sampleFloor takes a sample of f (nil: none), its steps added to the
// daemon's breakdowns if they are asked for.
func (d *daemon) sampleFloor(ctx context.Context, o Options, f *floor) error {
	var tr *traces
	if o.Breakdown {
		tr = &d.traces
	}
	return f.sample(ctx, o.Progress, tr)
}

// exec runs a command in a VM through the daemon and returns its stdout.
func (d *daemon) exec(ctx context.Context, name, cmd string) (string, error) {
	sc, err := d.client.SSH(ctx, name)
	if err != nil {
		return "", err
	}
	defer sc.Close()
	sess, err := sc.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	var out bytes.Buffer
	sess.Stdout = &out
	err = sess.Run(cmd)
	return out.String(), err
}

// firstOutput times echo until its first byte of output; the end of ctx
// ends the session.
func (d *daemon) firstOutput(ctx context.Context, name string) (time.Duration, error) {
	return d.firstOutputOf(ctx, name, "echo ready")
}

// firstOutputOf times the command line cmd until its first byte of
// output; the end of ctx ends the session.
func (d *daemon) firstOutputOf(ctx context.Context, name, cmd string) (time.Duration, error) {
	start := time.Now()
	sc, err := d.client.SSH(ctx, name)
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	defer context.AfterFunc(ctx, func() { _ = sc.Close() })()
	sess, err := sc.NewSession()
	if err != nil {
		return 0, err
	}
	defer sess.Close()
	out, err := sess.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := sess.Start(cmd); err != nil {
		return 0, err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(out, b); err != nil {
		return 0, err
	}
	took := time.Since(start)
	_ = sess.Wait()
	return took, nil
}

// runAll measures every figure for the daemon's VMM (a comparison
// variant: the memory-size figures only).
func (d *daemon) runAll(ctx context.Context, o Options, v variant, accel string) ([]Figure, error) {
	var figs []Figure
	add := func(name, mem string, ds []time.Duration) {
		if len(ds) > 0 {
			figs = append(figs, figure(name, d.vmm, accel, mem, ds))
		}
	}
	say := func(s string) { o.Progress(d.vmm + ": " + s) }

	say("warm-up (imports the image, warms its base snapshot)")
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: "warmup", IdleTimeout: "0"}, nil); err != nil {
		return figs, err
	}
	if _, err := d.exec(ctx, "warmup", "true"); err != nil {
		return figs, err
	}
	_ = d.client.RemoveVM(ctx, "warmup", true)

	// Create is timed twice: to running (den create's answer, the VM's
	// agent ready, as the floor's restore is timed) and to a first exec's
	// output.
	var cold, warm, warmRunning []time.Duration
	for i := 0; i < o.Runs && !v.compare; i++ {
		if err := d.sampleFloor(ctx, o, d.floor); err != nil {
			return figs, err
		}
		say(fmt.Sprintf("create, cold and warm (%d/%d)", i+1, o.Runs))
		for _, c := range []struct {
			cold bool
			ds   *[]time.Duration
		}{{true, &cold}, {false, &warm}} {
			name := fmt.Sprintf("c%d-%v", i, c.cold)
			name = strings.ReplaceAll(name, "true", "cold")
			name = strings.ReplaceAll(name, "false", "warm")
			var running time.Duration
			t, err := timed(func() error {
				start, span := time.Now(), startCPU()
				if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, Cold: c.cold, IdleTimeout: "0"}, nil); err != nil {
					return err
				}
				running, d.opCPU = time.Since(start), span.ms() // the trace ends there
				_, err := d.firstOutput(ctx, name)
				return err
			})
			if err != nil {
				return figs, fmt.Errorf("create %s: %w", name, err)
			}
			*c.ds = append(*c.ds, t)
			if !c.cold {
				warmRunning = append(warmRunning, running)
			}
			if err := d.addTrace(ctx, o, map[bool]string{true: "create (cold boot)", false: "create (warm base)"}[c.cold], "512M", name); err != nil {
				return figs, err
			}
			_ = d.client.RemoveVM(ctx, name, true)
		}
	}
	add("create to exec-ready (cold boot)", "512M", cold)
	add("create to exec-ready (warm base)", "512M", warm)
	add("create to running (warm base)", "512M", warmRunning)

	type size struct {
		label string
		bytes int64
	}
	mems := []size{{"512M", 512 << 20}}
	if !o.Quick {
		mems = append(mems, size{"1G", 1 << 30}, size{"2G", 2 << 30})
	}
	for _, m := range mems {
		f, err := d.lifecycle(ctx, o, accel, m.label, m.bytes, !v.compare, say)
		figs = append(figs, f...)
		if err != nil {
			return figs, err
		}
	}
	if !o.Quick && !v.compare {
		f, err := d.wakeBySize(ctx, o, accel, say)
		figs = append(figs, f...)
		if err != nil {
			return figs, err
		}
	}
	if !v.compare || v.storage {
		f, err := d.storageFigures(ctx, o, accel, v.compare, say)
		figs = append(figs, f...)
		if err != nil {
			return figs, err
		}
	}
	if !v.compare {
		f, err := d.activityCost(ctx, o, accel, say)
		figs = append(figs, f...)
		if err != nil {
			return figs, err
		}
	}
	figs, err := d.hostlife(ctx, o, v, accel, figs, say)
	if err != nil {
		return figs, err
	}
	return d.sleepers(ctx, o, v, accel, figs, say)
}

// wakeBySize times wakes of a 512 MiB and a 2 GiB guest (64 MiB of
// ballast each) taken in turn, run after run, each size first in every
// other run: the sizes' figures above are minutes apart, and this host's
// speed drifts over minutes. With the floor measured (QEMU), each wake has
// beside it a floor's restore of a guest of its size and ballast: what
// the VMM alone spends more on the larger guest.
func (d *daemon) wakeBySize(ctx context.Context, o Options, accel string, say func(string)) ([]Figure, error) {
	sizes := []struct {
		label string
		bytes int64
	}{{"512M", 512 << 20}, {"2G", 2 << 30}}
	ds := make([][]time.Duration, len(sizes))
	floors := make([]*floor, len(sizes))
	for j, s := range sizes {
		name := "i" + strings.ToLower(s.label)
		if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, MemoryBytes: s.bytes, IdleTimeout: "0"}, nil); err != nil {
			return nil, err
		}
		defer func() { _ = d.client.RemoveVM(context.WithoutCancel(ctx), name, true) }()
		if _, err := d.exec(ctx, name, ballastCmd); err != nil {
			return nil, err
		}
		if d.floor == nil {
			continue
		}
		f, err := newFloor(ctx, o, floorGuest{name: floorInTurn, label: s.label, bytes: s.bytes, ballast: true,
			note: "no den: as the main floor, for a guest of each size with 64 MiB of ballast, sampled beside den's wake of the same size"}, o.Progress)
		if err != nil {
			return nil, err
		}
		defer f.close()
		floors[j] = f
	}
	for i := 0; i <= o.Runs; i++ { // the first is a warm-up
		say(fmt.Sprintf("wakes of 512M and 2G in turn (%d/%d)", i+1, o.Runs+1))
		for k := range sizes {
			// Which goes first alternates: the second wake of a pair
			// runs beside what the first left in the background.
			j := k
			if i%2 == 1 {
				j = len(sizes) - 1 - k
			}
			s := sizes[j]
			name := "i" + strings.ToLower(s.label)
			// The floor's sample of the size comes right before den's
			// sleep and wake in half the runs, right after them in the
			// others: each runs as often beside what the other left
			// in the background (a QEMU's exit, a suspend slot's
			// removal).
			floorFirst := (i/2)%2 == 0
			sample := func() error {
				if i == 0 {
					return nil
				}
				return d.sampleFloor(ctx, o, floors[j])
			}
			if floorFirst {
				if err := sample(); err != nil {
					return nil, err
				}
			}
			if _, err := d.client.Sleep(ctx, name, api.SleepRequest{}); err != nil {
				return nil, fmt.Errorf("sleep %s: %w", name, err)
			}
			t, err := d.timed(func() error { _, err := d.client.Wake(ctx, name); return err })
			if err != nil {
				return nil, fmt.Errorf("wake %s: %w", name, err)
			}
			if i > 0 {
				ds[j] = append(ds[j], t)
				if err := d.addTrace(ctx, o, wakeInTurn, s.label, name); err != nil {
					return nil, err
				}
			}
			if !floorFirst {
				if err := sample(); err != nil {
					return nil, err
				}
			}
		}
	}
	var figs []Figure
	for j, s := range sizes {
		figs = append(figs, figure(wakeInTurn, d.vmm, accel, s.label, ds[j]))
		if floors[j] != nil {
			figs = append(figs, floors[j].figure())
		}
	}
	return figs, nil
}

// wakeInTurn is the figure wakeBySize measures.
const wakeInTurn = "wake to running (512M and 2G in turn)"

// lifecycle measures checkpoint, restore, sleep, wake and the gateway on
// one VM of the given memory size.
func (d *daemon) lifecycle(ctx context.Context, o Options, accel, label string, mem int64, gateway bool, say func(string)) ([]Figure, error) {
	name := "b" + strings.ToLower(label)
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, MemoryBytes: mem, IdleTimeout: "0"}, nil); err != nil {
		return nil, err
	}
	// Give the guest something in memory, as a working VM has.
	if _, err := d.exec(ctx, name, ballastCmd); err != nil {
		return nil, err
	}
	var cpMem, cpDisk, restore, sleep, wake, wakeExec, clone, cloneCtl, wakeSealed []time.Duration
	var sleepingRSS []float64
	for i := 0; i < o.Runs; i++ {
		if gateway && label == "512M" { // the main run's figures are set against the floor
			if err := d.sampleFloor(ctx, o, d.floor); err != nil {
				return nil, err
			}
		}
		say(fmt.Sprintf("%s: checkpoint, restore, sleep, wake (%d/%d)", label, i+1, o.Runs))
		var id string
		t, err := d.timed(func() error {
			cp, err := d.client.Checkpoint(ctx, name, api.CheckpointRequest{}, nil)
			id = cp.ID
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		cpMem = append(cpMem, t)
		if err := d.addTrace(ctx, o, "checkpoint (memory+disk)", label, name); err != nil {
			return nil, err
		}
		if t, err = timed(func() error {
			_, err := d.client.Checkpoint(ctx, name, api.CheckpointRequest{DiskOnly: true}, nil)
			return err
		}); err != nil {
			return nil, fmt.Errorf("disk-only checkpoint: %w", err)
		}
		cpDisk = append(cpDisk, t)
		if t, err = d.timed(func() error {
			_, err := d.client.Restore(ctx, name, api.RestoreRequest{Checkpoint: id, NoSave: true}, nil)
			return err
		}); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		restore = append(restore, t)
		if err := d.addTrace(ctx, o, "restore (memory+disk)", label, name); err != nil {
			return nil, err
		}
		if t, err = d.timed(func() error { _, err := d.client.Sleep(ctx, name, api.SleepRequest{}); return err }); err != nil {
			return nil, fmt.Errorf("sleep: %w", err)
		}
		sleep = append(sleep, t)
		if err := d.addTrace(ctx, o, "sleep", label, name); err != nil {
			return nil, err
		}
		rss, err := d.vmmRSS(name)
		if err != nil {
			return nil, err
		}
		sleepingRSS = append(sleepingRSS, float64(rss))
		if t, err = d.timed(func() error { _, err := d.client.Wake(ctx, name); return err }); err != nil {
			return nil, fmt.Errorf("wake: %w", err)
		}
		wake = append(wake, t)
		if err := d.addTrace(ctx, o, "wake", label, name); err != nil {
			return nil, err
		}
		if _, err := d.client.Sleep(ctx, name, api.SleepRequest{}); err != nil {
			return nil, err
		}
		if t, err = d.firstOutput(ctx, name); err != nil {
			return nil, fmt.Errorf("wake by exec: %w", err)
		}
		wakeExec = append(wakeExec, t)
		if t, c, err := d.cloneDisk(ctx, name, i); err == nil {
			clone, cloneCtl = append(clone, t), append(cloneCtl, c)
		}
		if gateway { // the main run: a wake that verifies all it reads
			if t, err = d.sealedWake(ctx, name); err != nil {
				return nil, fmt.Errorf("wake, memory verified: %w", err)
			}
			wakeSealed = append(wakeSealed, t)
		}
	}
	figs := []Figure{
		figure("checkpoint (memory+disk)", d.vmm, accel, label, cpMem),
		figure("checkpoint (disk-only)", d.vmm, accel, label, cpDisk),
		figure("restore (memory+disk, to running)", d.vmm, accel, label, restore),
		figure("sleep", d.vmm, accel, label, sleep),
		figure("wake to running", d.vmm, accel, label, wake),
		figure("wake to first exec output", d.vmm, accel, label, wakeExec),
	}
	if len(wakeSealed) > 0 {
		figs = append(figs, figure("wake to running, memory digests written and verified", d.vmm, accel, label, wakeSealed))
	}
	if len(clone) > 0 {
		figs = append(figs, figure("clone of the VM disk (juicefs clone)", d.vmm, accel, label, clone),
			figure("clone of the VM disk (control file, as den does)", d.vmm, accel, label, cloneCtl))
	}
	rss := Figure{Name: "host memory held by the sleeping VM's VMM", VMM: d.vmm, Accel: accel, Memory: label,
		Unit: "bytes", Samples: sleepingRSS, Note: "resident memory of processes for the VM while it sleeps"}
	rss.Median, rss.Min, rss.Max = stats(rss.Samples)
	figs = append(figs, rss)
	if gateway {
		say(label + ": den checkpoint verify")
		f, err := d.verifyThroughput(ctx, o, accel, label, name)
		if err != nil {
			return figs, err
		}
		figs = append(figs, f)
	}
	if !o.Quick && gateway {
		g, err := d.gateway(ctx, o, accel, label, name, say)
		if err != nil {
			return figs, err
		}
		figs = append(figs, g...)
	}
	_ = d.client.RemoveVM(ctx, name, true)
	return figs, nil
}

// vmmRSS sums the resident memory of processes whose command line names
// the VM's runtime directory: while it sleeps there must be none.
func (d *daemon) vmmRSS(name string) (int64, error) {
	run := filepath.Join(d.dir, "state", "run", name)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, e := range ents {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(run+"/")) {
			continue
		}
		status, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		for _, line := range strings.Split(string(status), "\n") {
			var kb int64
			if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
				total += kb << 10
			}
		}
	}
	return total, nil
}

// cloneDisk times a metadata-only clone of the VM's disk on the volume:
// by the juicefs binary, and as den makes it (through the mount's control
// file, without starting a process).
func (d *daemon) cloneDisk(ctx context.Context, name string, i int) (cli, control time.Duration, err error) {
	info, err := d.client.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	juicefs := os.Getenv("DEN_JUICEFS")
	if juicefs == "" {
		juicefs = filepath.Join(filepath.Dir(os.Args[0]), "juicefs")
	}
	src := filepath.Join(info.Volume, "vms", name, "disk")
	dst := filepath.Join(info.Volume, "vms", name, fmt.Sprintf("bench-clone-%d", i))
	t, err := timed(func() error { return exec.CommandContext(ctx, juicefs, "clone", src, dst).Run() })
	_ = os.Remove(dst)
	if err != nil {
		return 0, 0, err
	}
	c, err := timed(func() error { return storage.ControlClone(ctx, info.Volume, src, dst) })
	_ = os.Remove(dst)
	return t, c, err
}

// gateway times ssh connect to first output through the SSH gateway,
// for the VM running and asleep.
func (d *daemon) gateway(ctx context.Context, o Options, accel, label, name string, say func(string)) ([]Figure, error) {
	info, err := d.client.Info(ctx)
	if err != nil || info.Gateway == "" {
		return nil, nil
	}
	if _, err := exec.LookPath("ssh"); err != nil {
		return nil, nil
	}
	key := filepath.Join(d.dir, "id_ed25519")
	if _, err := os.Stat(key); err != nil {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ssh-keygen: %v: %s", err, out)
		}
		pub, _ := os.ReadFile(key + ".pub")
		if _, err := d.client.AddKey(ctx, api.AddKeyRequest{PublicKey: string(pub)}); err != nil {
			return nil, err
		}
	}
	host, port, _ := net.SplitHostPort(info.Gateway)
	sshRun := func() (time.Duration, error) {
		cmd := exec.CommandContext(ctx, "ssh", "-p", port, "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
			"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", name+"@"+host, "echo ready")
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		b := make([]byte, 1)
		_, rerr := io.ReadFull(out, b)
		took := time.Since(start)
		werr := cmd.Wait()
		return took, errors.Join(rerr, werr)
	}
	var running, sleeping []time.Duration
	for i := 0; i < o.Runs; i++ {
		say(fmt.Sprintf("%s: ssh through the gateway (%d/%d)", label, i+1, o.Runs))
		t, err := sshRun()
		if err != nil {
			return nil, fmt.Errorf("ssh to a running vm: %w", err)
		}
		running = append(running, t)
		if _, err := d.client.Sleep(ctx, name, api.SleepRequest{}); err != nil {
			return nil, err
		}
		if t, err = sshRun(); err != nil {
			return nil, fmt.Errorf("ssh to a sleeping vm: %w", err)
		}
		sleeping = append(sleeping, t)
	}
	return []Figure{
		figure("ssh connect to first output (running)", d.vmm, accel, label, running),
		figure("ssh connect to first output (sleeping)", d.vmm, accel, label, sleeping),
	}, nil
}
