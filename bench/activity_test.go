package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestAgentCPU: the wrappers report, in a POSIX shell, the CPU time of
// the process they watch (here this test's own, spinning meanwhile),
// which agentTicks reads back.
func TestAgentCPU(t *testing.T) {
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	defer close(stop)
	out, err := exec.Command("/bin/sh", "-c", withAgentCPU("echo noise; sleep 0.3", os.Getpid())).Output()
	if err != nil {
		t.Fatal(err)
	}
	after, err := exec.Command("/bin/sh", "-c", agentAfter(os.Getpid())).Output()
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := agentTicks(string(out), string(after))
	if err != nil {
		t.Fatal(err)
	}
	if cpu <= 0 || cpu > time.Minute {
		t.Errorf("CPU time %v of a spinning process over 0.3 s (%q)", cpu, out)
	}
	if _, err := agentTicks(string(out), "nothing"); err == nil {
		t.Error("no ticks line read as ticks")
	}
}

// TestPaired: the run-by-run ratio is the median of each pair's ratio,
// which a drift shared by both halves of a pair does not move.
func TestPaired(t *testing.T) {
	r := Result{Figures: []Figure{
		{Name: "on", VMM: "qemu", Memory: "512M", Samples: []float64{110, 220, 330, 1000}},
		{Name: "off", VMM: "qemu", Memory: "512M", Samples: []float64{100, 200, 300, 2000}},
		{Name: "short", VMM: "qemu", Memory: "512M", Samples: []float64{1}},
	}}
	if got := r.paired("on", "off", "qemu", "512M"); got < 1.0999 || got > 1.1001 {
		t.Errorf("paired = %v, want 1.1", got)
	}
	if got := r.paired("on", "short", "qemu", "512M"); got != 0 {
		t.Errorf("paired with a figure of another count = %v, want 0", got)
	}
	if got := r.paired("on", "absent", "qemu", "512M"); got != 0 {
		t.Errorf("paired with an absent figure = %v, want 0", got)
	}
}
