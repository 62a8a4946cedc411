package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/api"
)

// hostlifeVMs is how many small running guests the host's life is
// measured with.
const hostlifeVMs = 4

// hostlife measures a host's shutdown and boot with hostlifeVMs small
// running guests (each with a background process and some memory
// written): the shutdown path (den sleep --all --shutdown) until every VM
// sleeps, then a daemon stop and start, from the start until the API
// answers (the boot wake must not hold it up) and until the daemon has
// woken every VM by itself. It appends its figures to figs.
func (d *daemon) hostlife(ctx context.Context, o Options, v variant, accel string, figs []Figure, say func(string)) ([]Figure, error) {
	if v.compare {
		return figs, nil
	}
	label := fmt.Sprintf("%dx256M", hostlifeVMs)
	var names []string
	for i := range hostlifeVMs {
		name := fmt.Sprintf("h%d", i)
		say(fmt.Sprintf("host shutdown and boot: create %s", name))
		if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, MemoryBytes: 256 << 20, IdleTimeout: "0"}, nil); err != nil {
			return figs, fmt.Errorf("hostlife: %w", err)
		}
		if _, err := d.exec(ctx, name, "dd if=/dev/urandom of=/tmp/ballast bs=1M count=32 2>/dev/null; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/pid"); err != nil {
			return figs, fmt.Errorf("hostlife: %w", err)
		}
		names = append(names, name)
	}
	var shut, serve, boot []time.Duration
	for i := 0; i < o.Runs; i++ {
		say(fmt.Sprintf("host shutdown and boot, %d vms (%d/%d)", hostlifeVMs, i+1, o.Runs))
		t, err := timed(func() error {
			sum, err := d.client.SleepAll(ctx, api.HostSleepRequest{Shutdown: true}, nil)
			if err == nil && len(sum.Failed) > 0 {
				err = fmt.Errorf("not asleep: %s", strings.Join(sum.Failed, ", "))
			}
			return err
		})
		if err != nil {
			return figs, fmt.Errorf("hostlife: sleep --all --shutdown: %w", err)
		}
		shut = append(shut, t)
		up, all, err := d.restartAndWaitAwake(ctx, names)
		if err != nil {
			return figs, fmt.Errorf("hostlife: boot: %w", err)
		}
		serve, boot = append(serve, up), append(boot, all)
		for _, n := range names {
			if out, err := d.exec(ctx, n, "kill -0 $(cat /tmp/pid) && echo alive"); err != nil || out != "alive\n" {
				return figs, fmt.Errorf("hostlife: %s after the boot: %q, %v", n, out, err)
			}
		}
	}
	for _, n := range names {
		_ = d.client.RemoveVM(ctx, n, true)
	}
	return append(figs,
		figure(fmt.Sprintf("host shutdown: %d running VMs to sleep (sleep --all --shutdown)", hostlifeVMs), d.vmm, accel, label, shut),
		figure("host boot: daemon start to API answering", d.vmm, accel, label, serve),
		figure(fmt.Sprintf("host boot: daemon start to %d VMs running (boot wake)", hostlifeVMs), d.vmm, accel, label, boot),
	), nil
}

// restartAndWaitAwake stops the daemon as a shutdown does (SIGTERM),
// starts it again with the same command line, and times from the start
// until the API answers and until every VM of names is running.
func (d *daemon) restartAndWaitAwake(ctx context.Context, names []string) (serve, awake time.Duration, err error) {
	if err := d.halt(); err != nil {
		return 0, 0, err
	}
	start, err := d.relaunch()
	if err != nil {
		return 0, 0, err
	}
	deadline := start.Add(5 * time.Minute)
	for serve == 0 || awake == 0 {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(d.dir, "daemon.log"))
			return 0, 0, fmt.Errorf("vms not all running 5m after the daemon started: %s", tail(log, 2000))
		}
		vms, err := d.client.ListVMs(ctx)
		if err == nil && serve == 0 {
			serve = time.Since(start)
		}
		if err == nil && allRunning(vms, names) {
			awake = time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return serve, awake, nil
}

func allRunning(vms []api.VM, names []string) bool {
	running := map[string]bool{}
	for _, vm := range vms {
		running[vm.Name] = vm.State == "running"
	}
	for _, n := range names {
		if !running[n] {
			return false
		}
	}
	return true
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
