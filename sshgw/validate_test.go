package sshgw

import (
	"strings"
	"testing"
)

// TestBadVMNameRefused: the VM of VM@host is the SSH user name, a name
// like any other: a bad one is refused by den's rules (internal/validate)
// before the backend is asked for anything, quoted cut short.
func TestBadVMNameRefused(t *testing.T) {
	f := newFixture(t, nil)
	for _, vm := range []string{"../x", "Box", "a_b", "-a", strings.Repeat("a", 200)} {
		c, err := f.dial(vm, f.alice)
		if err != nil {
			t.Fatalf("dial %.20q: %v", vm, err)
		}
		out, errs, code := run(t, c, "exit 0")
		c.Close()
		if out != "" || code != 255 || !strings.Contains(errs, "den: bad vm name") || len(errs) > 400 {
			t.Errorf("%.20q@host: out %q, stderr %q, exit %d; want 255 and the name refused", vm, out, errs, code)
		}
	}
	if n := f.b.opens.Load(); n != 0 {
		t.Errorf("the backend opened %d vms for bad names", n)
	}
}
