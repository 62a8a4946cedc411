package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestAgentCPU: the wrapper runs the work in a POSIX shell and reports
// the CPU time of the process it watches (here this test's own, spinning
// meanwhile), which agentTicks reads back.
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
	cpu, err := agentTicks(string(out))
	if err != nil {
		t.Fatal(err)
	}
	if cpu <= 0 || cpu > time.Minute {
		t.Errorf("CPU time %v of a spinning process over 0.3 s (%q)", cpu, out)
	}
	if _, err := agentTicks("nothing"); err == nil {
		t.Error("no ticks line read as ticks")
	}
}
