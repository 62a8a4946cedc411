package e2e

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// TestTakenNameAndDeletedIDs, with TAP networking (issue 35's first two
// findings):
//
//   - `den fork a@cp-1 b` onto an existing b is refused and leaves b's
//     network as it was: b answers, reaches the wan server from its own
//     address on its own TAP, keeps them through a sleep and wake, and
//     the next VM made gets another subnet;
//   - deleting the newest checkpoint does not give its id out again: the
//     next one gets a new id, descends from the deleted one's parent, and
//     `den checkpoints` lists every checkpoint; a VM removed and made
//     again under its name goes on from its ids.
func TestTakenNameAndDeletedIDs(t *testing.T) {
	n := newTestNet(t)
	n.serveHTTP(n.wan, wanAddr+":80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from wan, you are %s\n", strings.Split(r.RemoteAddr, ":")[0])
	}))
	d := startNetDaemon(t, n)
	d.must("create", "a", "--memory", "256M")
	d.must("create", "b", "--memory", "256M")
	if id := strings.TrimSpace(d.must("checkpoint", "a")); id != "cp-1" {
		t.Fatalf("first checkpoint of a: %q", id)
	}
	b, bTap := d.netInfo("b"), tapOf(t, d, "b")
	if b.Network != "tap" || b.IP == "" || b.IP == d.netInfo("a").IP {
		t.Fatalf("b is not on a tap of its own: %+v", b)
	}
	taps := func() string { return n.ip(n.den, "-o", "link", "show", "type", "tun") }
	whole := func(when string) {
		t.Helper()
		if vm := d.netInfo("b"); vm.IP != b.IP || vm.Network != "tap" {
			t.Fatalf("after %s b is %+v, was %+v", when, vm, b)
		}
		if tap := tapOf(t, d, "b"); tap != bTap {
			t.Fatalf("after %s b is on tap %s, was %s", when, tap, bTap)
		}
		if !strings.Contains(taps(), bTap) || !strings.Contains(n.nft(n.den), `"`+bTap+`"`) {
			t.Fatalf("after %s b's tap %s or its rules are gone:\n%s\n%s", when, bTap, taps(), n.nft(n.den))
		}
		if _, ip := d.guestAddr("b"); ip != b.IP {
			t.Fatalf("after %s the guest b has %s, den says %s", when, ip, b.IP)
		}
		if out, err := d.fetch("b", "http://"+wanAddr+"/"); err != nil || out != "hello from wan, you are "+denUplink+"\n" {
			t.Fatalf("after %s b cannot reach the wan server: %q %v", when, out, err)
		}
	}
	whole("its create")

	for _, from := range []string{"a@cp-1", "a"} {
		_, err := d.run("fork", from, "b")
		if exitCode(err) == 0 || !strings.Contains(stderrOf(err), "already exists") {
			t.Fatalf("den fork %s b: exit %d, %q; want it refused as existing", from, exitCode(err), stderrOf(err))
		}
	}
	d.must("exec", "b", "--", "true")
	whole("the refused forks")
	d.must("create", "c", "--memory", "256M")
	if c := d.netInfo("c"); c.IP == b.IP || c.Network != "tap" {
		t.Fatalf("c got %+v, b has %s", c, b.IP)
	}
	whole("a create after the refused forks")
	d.must("sleep", "b")
	d.must("wake", "b")
	whole("a sleep and wake")
	if cps := d.checkpoints("a"); len(cps) != 1 {
		t.Fatalf("the refused forks left checkpoints of a: %+v", cps)
	}

	t.Run("deleted ids", func(t *testing.T) {
		take := func(vm, want string) {
			t.Helper()
			if id := strings.TrimSpace(d.must("checkpoint", vm)); id != want {
				t.Fatalf("checkpoint of %s: %q, want %s", vm, id, want)
			}
		}
		take("a", "cp-2")
		d.must("checkpoint", "rm", "a", "cp-2")
		take("a", "cp-3")
		take("a", "cp-4")
		want := []checkpointJSON{
			{ID: "cp-1", Kind: "memory+disk"},
			{ID: "cp-3", Parent: "cp-1", Kind: "memory+disk"},
			{ID: "cp-4", Parent: "cp-3", Kind: "memory+disk", Head: true},
		}
		if cps := d.checkpoints("a"); !reflect.DeepEqual(cps, want) {
			t.Fatalf("den checkpoints a after deleting the newest:\n%+v\nwant\n%+v", cps, want)
		}
		out := d.must("checkpoints", "a")
		for _, id := range []string{"cp-1", "cp-3", "cp-4"} {
			if !strings.Contains(out, id) {
				t.Fatalf("den checkpoints a does not show %s:\n%s", id, out)
			}
		}
		d.must("rm", "a")
		d.must("create", "a", "--memory", "256M")
		take("a", "cp-5")
		if cps := d.checkpoints("a"); len(cps) != 1 || cps[0].ID != "cp-5" || cps[0].Parent != "" || !cps[0].Head {
			t.Fatalf("den checkpoints of the new a: %+v", cps)
		}
	})
}
