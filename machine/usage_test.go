//go:build linux

package machine_test

import (
	"testing"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
)

// TestDiskUseShared: a VM put to sleep has its disk measured in the
// background and the figure recorded in the registry, at the record's
// generation; a daemon that starts later (or another host of a cluster)
// lists it without measuring it again; a wake makes it stale, the next
// sleep records the next one, and a removal takes it away.
func TestDiskUseShared(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	e.create("b")
	for _, n := range []string{"a", "b"} {
		if err := e.m.Sleep(ctx, n, false); err != nil {
			t.Fatal(err)
		}
	}
	recorded := func(name string) (registry.DiskUsage, bool) {
		us, err := e.reg.DiskUsages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		u, ok := us[name]
		return u, ok && u.Holds(e.record(name)) && u.Data > 0
	}
	for _, n := range []string{"a", "b"} {
		testutil.WaitForWithin(t, testTimeout, "the disk use of "+n+" recorded after its sleep", func() bool {
			_, ok := recorded(n)
			return ok
		})
	}
	ua, _ := recorded("a")

	e.restart()
	before := e.vol.UsageCalls()
	sts, err := e.m.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if n := e.vol.UsageCalls() - before; n != 0 {
		t.Fatalf("the listing after a restart measured %d disks; the registry had their figures", n)
	}
	for _, st := range sts {
		if st.Name == "a" && st.DiskUsed != ua.Data {
			t.Fatalf("a lists %d bytes used, the registry says %d", st.DiskUsed, ua.Data)
		}
	}

	if err := e.m.Wake(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := recorded("a"); ok {
		t.Fatal("a figure holds for a woken vm")
	}
	if err := e.m.Sleep(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, testTimeout, "the disk use of a recorded after its second sleep", func() bool {
		_, ok := recorded("a")
		return ok
	})

	if err := e.m.Remove(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	us, err := e.reg.DiskUsages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := us["b"]; ok {
		t.Fatal("a removed vm's disk use is still recorded")
	}
}

// A listing waits only so long for the disks it measures: past listWait,
// a VM lists its last figure, marked as being measured, and a listing
// meanwhile waits for the same measure instead of starting another; the
// next listing once it is done has the figure.
func TestListWaitsSoLongForMeasures(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("a")
	e.create("b")
	if err := e.m.Sleep(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, testTimeout, "the disk use of a measured after its sleep", func() bool {
		st, err := e.m.Brief(ctx, "a")
		return err == nil && st.DiskUsed > 0
	})
	release := e.vol.HoldUsage()
	t.Cleanup(release)
	before := e.vol.UsageCalls()
	find := func(sts []machine.Status, name string) machine.Status {
		for _, st := range sts {
			if st.Name == name {
				return st
			}
		}
		t.Fatalf("no %s in the listing", name)
		return machine.Status{}
	}
	for range 2 {
		sts, err := e.m.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if a, b := find(sts, "a"), find(sts, "b"); a.DiskMeasuring || a.DiskUsed == 0 || !b.DiskMeasuring || b.DiskUsed != 0 {
			t.Fatalf("listing while b's disk is measured: a %v %d, b %v %d", a.DiskMeasuring, a.DiskUsed, b.DiskMeasuring, b.DiskUsed)
		}
	}
	if n := e.vol.UsageCalls() - before; n != 1 {
		t.Fatalf("two listings measured %d disks, want b's once", n)
	}
	release()
	testutil.WaitForWithin(t, testTimeout, "a listing with b's figure", func() bool {
		sts, err := e.m.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		b := find(sts, "b")
		return !b.DiskMeasuring && b.DiskUsed > 0
	})
}
