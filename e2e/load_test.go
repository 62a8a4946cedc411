package e2e

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLoad: 8 small VMs created, given work, checkpointed, put to sleep
// and woken, all at once, while another client polls ls and info without
// pause. Every VM ends running with its file and its process.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: needs root, images and QEMU")
	}
	d := startDaemon(t)
	const n = 8
	// The warm base is made once, before the crowd arrives.
	d.must("create", "vm0", "--memory", "128M", "--idle-timeout", "0")
	stop := make(chan struct{})
	var polls atomic.Int64
	var pollErr atomic.Value
	var pollers sync.WaitGroup
	pollers.Add(1)
	go func() {
		defer pollers.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			args := []string{"ls", "--json"}
			if i%2 == 1 {
				args = []string{"info", fmt.Sprintf("vm%d", i%n), "--json"}
			}
			out, err := d.run(args...)
			if err != nil && !strings.Contains(stderrOf(err), "no vm named") {
				pollErr.Store(err.Error())
			}
			if strings.Contains(out, "vmm process not found") {
				pollErr.Store("a poll saw: " + out)
			}
			polls.Add(1)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("vm%d", i)
			steps := [][]string{
				{"exec", name, "--", "sh", "-c", startWork},
				{"checkpoint", name, "-m", "load"},
				{"sleep", name},
				{"wake", name},
			}
			if i > 0 {
				steps = append([][]string{{"create", name, "--memory", "128M", "--idle-timeout", "0"}}, steps...)
			}
			for _, s := range steps {
				if _, err := d.run(s...); err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(stop)
	pollers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if v := pollErr.Load(); v != nil {
		t.Errorf("polling: %v", v)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("vm%d", i)
		if vm := d.info(name); vm.State != "running" {
			t.Errorf("%s: %s (%s)", name, vm.State, vm.Reason)
		}
		if out := d.must("exec", name, "--", "sh", "-c", checkWork); out != "v1\nalive\n" {
			t.Errorf("%s holds %q", name, out)
		}
		if cps := d.checkpoints(name); len(cps) != 1 {
			t.Errorf("%s: checkpoints %+v", name, cps)
		}
	}
	t.Logf("%d polls during the load", polls.Load())
}
