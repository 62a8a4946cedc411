//go:build linux

package machine_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/denhq/den/internal/netns"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/network"
	"github.com/denhq/den/registry"
)

// envOwnNetns marks the process a test started again inside a network
// namespace of its own (its value is the namespace).
const envOwnNetns = "DEN_MACHINE_TEST_NETNS"

// inOwnNetns runs the calling test again as a new process inside a
// network namespace of its own, so that every thread of it is there (the
// Manager's network runs nft, netlink and the resolver from any thread),
// and says whether this is that process. The outer process passes the
// inner one's verdict on and returns false.
func inOwnNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envOwnNetns) != "" {
		return true
	}
	if err := netns.Usable(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft (make deps installs nftables)")
	}
	if err := network.Unavailable(); err != nil {
		t.Skip(err)
	}
	ns := fmt.Sprintf("dnmt%d", os.Getpid()%100000)
	_ = exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), envOwnNetns+"="+ns)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Started from a thread inside ns, the process is born there.
	err := netns.In(ns, cmd.Run)
	t.Logf("in network namespace %s:\n%s", ns, out.String())
	if err != nil {
		t.Fatalf("%s in its own network namespace: %v", t.Name(), err)
	}
	if !strings.Contains(out.String(), "--- PASS: "+t.Name()) {
		t.Fatalf("%s did not run in its own network namespace", t.Name())
	}
	return false
}

// leaseOf is the network lease recorded for a VM (nil: none).
func leaseOf(t *testing.T, vm registry.VM) *network.Lease {
	t.Helper()
	var sp struct {
		Net *network.Lease `json:"net"`
	}
	if err := json.Unmarshal([]byte(vm.SpecJSON), &sp); err != nil {
		t.Fatalf("spec of %s: %v", vm.Name, err)
	}
	return sp.Net
}

// onNetwork says whether the host has a VM's TAP (up) and rules for it.
func onNetwork(t *testing.T, l *network.Lease) error {
	t.Helper()
	ifc, err := net.InterfaceByName(l.Tap)
	if err != nil {
		return fmt.Errorf("tap %s: %w", l.Tap, err)
	}
	if ifc.Flags&net.FlagUp == 0 {
		return fmt.Errorf("tap %s is down", l.Tap)
	}
	rules, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft list ruleset: %w: %s", err, rules)
	}
	if !strings.Contains(string(rules), `"`+l.Tap+`"`) {
		return fmt.Errorf("no rules for tap %s:\n%s", l.Tap, rules)
	}
	return nil
}

// TestRefusedForkKeepsTheOtherVMsNetwork: with TAP networking (in a
// network namespace of its own), a fork onto the name of a VM that
// exists is refused and leaves that VM's network as it was: its TAP, its
// rules, its lease in its record and in the host network, its subnet
// not given to the next VM. Nothing of the pool is leaked either: the
// next create gets the lowest subnet nobody holds.
func TestRefusedForkKeepsTheOtherVMsNetwork(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	pool, err := network.ParsePool("10.231.0.0/24")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, func(c *machine.Config) {
		c.Network = machine.NetworkConfig{Mode: machine.NetTap, Pool: pool}
	})
	ctx := ctxT(t)
	e.create("a")
	e.create("b")
	la, lb := leaseOf(t, e.record("a")), leaseOf(t, e.record("b"))
	if la == nil || lb == nil || la.Subnet == lb.Subnet {
		t.Fatalf("want two VMs on subnets of their own: a %v, b %v", la, lb)
	}
	if err := onNetwork(t, lb); err != nil {
		t.Fatalf("b before the fork: %v", err)
	}
	cp, err := e.m.Checkpoint(ctx, "a", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{cp.ID, ""} { // from a checkpoint, and from a's current state
		if _, err := e.m.Fork(ctx, "a", id, "b", nil); !errors.Is(err, machine.ErrExists) {
			t.Fatalf("fork a@%s onto b: %v, want it refused as existing", id, err)
		}
	}
	if got := leaseOf(t, e.record("b")); got == nil || *got != *lb {
		t.Fatalf("b's recorded lease is %v after the refused fork, was %v", got, lb)
	}
	if err := onNetwork(t, lb); err != nil {
		t.Fatalf("the refused fork took b off the network: %v", err)
	}
	st, err := e.m.NetStatus(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != "tap" || st.Host == nil || st.Host.Tap != lb.Tap {
		t.Fatalf("the host network no longer has b on %s: %+v %+v", lb.Tap, st, st.Host)
	}
	// b's subnet is not free: the next VM gets the next one, the
	// lowest that nobody holds (the refused fork kept none).
	e.create("c")
	lc := leaseOf(t, e.record("c"))
	if lc == nil || lc.Subnet == lb.Subnet || lc.Subnet == la.Subnet {
		t.Fatalf("c got %v: a has %v, b %v", lc, la, lb)
	}
	if want := pool.Subnet(2); lc.Subnet != want {
		t.Fatalf("c got %v, want %v, the lowest free subnet (a lease leaked)", lc.Subnet, want)
	}
	for _, v := range []struct {
		name string
		l    *network.Lease
	}{{"a", la}, {"b", lb}, {"c", lc}} {
		if err := onNetwork(t, v.l); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
	}
	// b is whole: it sleeps and wakes on its own network.
	if err := e.m.Sleep(ctx, "b", false); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Wake(ctx, "b"); err != nil {
		t.Fatalf("wake b after the refused fork: %v", err)
	}
	if err := onNetwork(t, lb); err != nil {
		t.Fatalf("b after a sleep and wake: %v", err)
	}

	// A fork whose bring-up fails after it was put on the network gives
	// back its own lease (TAP, rules, subnet), and only its own.
	ld := network.Lease{Subnet: pool.Subnet(3), Tap: strings.TrimSuffix(lc.Tap, "2") + "3"}
	wasOn := false
	e.drv.Hook = func(op, rd string) {
		if op == "restore" && strings.HasSuffix(rd, "/d") {
			wasOn = onNetwork(t, &ld) == nil
			e.drv.VM(e.state.Run("d")).Kill()
		}
	}
	if _, err := e.m.Fork(ctx, "a", cp.ID, "d", nil); err == nil {
		t.Fatal("fork with a dying vmm succeeded")
	}
	e.drv.Hook = nil
	if !wasOn {
		t.Fatalf("the fork was not on the network (%s) when its vmm died", ld.Tap)
	}
	if _, err := net.InterfaceByName(ld.Tap); err == nil {
		t.Fatalf("the failed fork left its tap %s", ld.Tap)
	}
	for _, v := range []struct {
		name string
		l    *network.Lease
	}{{"a", la}, {"b", lb}, {"c", lc}} {
		if err := onNetwork(t, v.l); err != nil {
			t.Fatalf("%s after a failed fork: %v", v.name, err)
		}
	}
	e.create("e")
	if le := leaseOf(t, e.record("e")); le == nil || *le != ld {
		t.Fatalf("e got %v, want %v, the failed fork's", le, ld)
	}
}
