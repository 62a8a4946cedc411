package network

import (
	"context"
	"errors"
	"testing"

	"github.com/denhq/den/egress"
)

// TestReleaseTouchesOnlyItsLease: Release gives back the one lease it is
// given. A second lease reserved under the name of a VM on the network
// goes without that VM's attachment; a lease that is not the name's, or
// is given back already, changes nothing. (Only leases never attached
// are given back here: no nft, no resolver.)
func TestReleaseTouchesOnlyItsLease(t *testing.T) {
	ctx := context.Background()
	pool, err := ParsePool("10.200.0.0/24")
	if err != nil {
		t.Fatal(err)
	}
	h := &Host{cfg: Config{Pool: pool, ID: "t"}, slots: map[int]string{}, vms: map[string]*attachment{}}
	lb, err := h.Reserve("b", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.register("b", lb, egress.Policy{}); err != nil { // b is on the network
		t.Fatal(err)
	}
	again, err := h.Reserve("b", false) // what a fork onto b's name took
	if err != nil {
		t.Fatal(err)
	}
	if again == lb {
		t.Fatalf("one lease handed out twice: %v", lb)
	}
	lc, err := h.Reserve("c", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx, "b", again); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx, "b", lc); err != nil { // c's, not b's
		t.Fatal(err)
	}
	if err := h.Release(ctx, "b", again); err != nil { // given back already
		t.Fatal(err)
	}
	if a, ok := h.vms["b"]; !ok || a.lease != lb {
		t.Fatalf("b's attachment is %+v after releasing another lease of its name", h.vms["b"])
	}
	slot := func(l Lease) string { return h.slots[pool.Slot(l.Subnet)] }
	if slot(lb) != "b" || slot(lc) != "c" || slot(again) != "" {
		t.Fatalf("slots after the release: %v", h.slots)
	}
	if l, err := h.Reserve("d", false); err != nil || l != again {
		t.Fatalf("the next lease is %v (%v), want the released %v", l, err, again)
	}
}

// TestKnowAndReserve: a subnet another host of a cluster gave a VM is
// passed by once known; a subnet held here stays its holder's; a lease
// held here refuses another VM's attachment, naming the holder; with
// anywhere, a free subnet is still what is taken.
func TestKnowAndReserve(t *testing.T) {
	pool, err := ParsePool("10.200.0.0/28") // 4 subnets
	if err != nil {
		t.Fatal(err)
	}
	h := &Host{cfg: Config{Pool: pool, ID: "t"}, slots: map[int]string{}, vms: map[string]*attachment{}}
	la, err := h.Reserve("a", false)
	if err != nil || la.Subnet != pool.Subnet(0) {
		t.Fatalf("first lease: %v %v", la, err)
	}
	h.Know("elsewhere", h.lease(1))
	h.Know("late", la) // held here: stays a's
	lb, err := h.Reserve("b", false)
	if err != nil || lb.Subnet != pool.Subnet(2) {
		t.Fatalf("the lease after a known subnet: %v %v, want %v", lb, err, pool.Subnet(2))
	}
	var taken *SubnetTakenError
	if _, _, err := h.register("late", la, egress.Policy{}); !errors.As(err, &taken) || taken.VM != "a" || taken.Subnet != la.Subnet {
		t.Fatalf("another vm on a's subnet: %v", err)
	}
	lc, err := h.Reserve("c", true)
	if err != nil || lc.Subnet != pool.Subnet(3) {
		t.Fatalf("anywhere, with one subnet free: %v %v", lc, err)
	}
	if _, err := h.Reserve("d", true); err == nil {
		t.Fatal("a lease from a full pool")
	}
}
