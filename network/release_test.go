package network

import (
	"context"
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
	lb, err := h.Reserve("b")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.register("b", lb, egress.Policy{}); err != nil { // b is on the network
		t.Fatal(err)
	}
	again, err := h.Reserve("b") // what a fork onto b's name took
	if err != nil {
		t.Fatal(err)
	}
	if again == lb {
		t.Fatalf("one lease handed out twice: %v", lb)
	}
	lc, err := h.Reserve("c")
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
	if l, err := h.Reserve("d"); err != nil || l != again {
		t.Fatalf("the next lease is %v (%v), want the released %v", l, err, again)
	}
}
