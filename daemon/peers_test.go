package daemon

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// TestChoose: placement takes the live host that admits VMs with the
// most free memory budget that fits the VM, and says why when none does.
func TestChoose(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	const gib = int64(1) << 30
	host := func(name string, budget, free int64, f func(*registry.Host)) registry.Host {
		h := registry.Host{Name: name, Address: "127.0.0.1:1", MemoryBudgetBytes: budget, MemoryFreeBytes: free, Heartbeat: now.Add(-time.Second)}
		if f != nil {
			f(&h)
		}
		return h
	}
	hosts := []registry.Host{
		host("a", 8*gib, 6*gib, nil), // this host
		host("b", 8*gib, 1*gib, nil),
		host("c", 8*gib, 3*gib, nil),
		host("dead", -1, -1, func(h *registry.Host) { h.Heartbeat = now.Add(-time.Minute) }),
		host("draining", -1, -1, func(h *registry.Host) { h.Draining = true }),
		host("no-address", -1, -1, func(h *registry.Host) { h.Address = "" }),
	}
	for _, c := range []struct {
		name  string
		hosts []registry.Host
		need  *machine.Need
		want  string // a host, or a part of the refusal
	}{
		{"a create: the most free", hosts, nil, "c"},
		{"fits where the most is free", hosts, &machine.Need{VM: "box", MemoryBytes: 512 << 20}, "c"},
		{"fits one host only", hosts[:3], &machine.Need{VM: "box", MemoryBytes: 2 * gib}, "c"},
		{"fits no host", hosts[:3], &machine.Need{VM: "box", MemoryBytes: 4 * gib}, `host c has 3G of its memory budget free, and vm "box" needs 4G`},
		{"no budget beats any budget", append(hosts[:3:3], host("unbounded", -1, -1, nil)), &machine.Need{VM: "box", MemoryBytes: 4 * gib}, "unbounded"},
		{"no other live host", hosts[3:], nil, "no other live host of the cluster admits vms"},
	} {
		got, err := choose(c.hosts, now, "a", 6*time.Second, c.need)
		if strings.Contains(c.want, " ") {
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, machine.ErrBusy) {
				t.Errorf("%s: got %q, %v; want a refusal with %q", c.name, got, err, c.want)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}
