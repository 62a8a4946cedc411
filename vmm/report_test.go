package vmm

import (
	"context"
	"os/exec"
	"testing"
)

func TestReport(t *testing.T) {
	q, _ := exec.LookPath("qemu-system-x86_64")
	r := Report(context.Background(), q, "nobody")
	t.Logf("%+v", r)
	if !r.Unprivileged || r.User != "nobody" {
		t.Errorf("user nobody not found: %+v", r)
	}
	if r2 := Report(context.Background(), "", "no-such-user-den"); r2.Unprivileged {
		t.Error("a missing user reported present")
	}
}
