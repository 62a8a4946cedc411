package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestoreStoppedSaves: restoring a VM whose QEMU died saves its
// disk first (a disk-only checkpoint: no memory is left), as a running
// VM's state is saved; a synced file written after the checkpoint
// restored to comes back from that saved checkpoint.
func TestRestoreStoppedSaves(t *testing.T) {
	restoreStoppedSaves(t, startDaemon(t), nil)
}

// TestRestoreStoppedSavesTAP is TestRestoreStoppedSaves on TAP
// networking: the restored VM also reaches the network again, with its
// address.
func TestRestoreStoppedSavesTAP(t *testing.T) {
	n := newTestNet(t)
	n.serveHTTP(n.wan, wanAddr+":80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("wan\n"))
	}))
	d := startNetDaemon(t, n)
	restoreStoppedSaves(t, d, func(vm string) {
		if out, err := d.fetch(vm, "http://"+wanAddr+"/"); err != nil || out != "wan\n" {
			t.Fatalf("%s fetching from the wan: %q %v", vm, out, err)
		}
	})
}

func restoreStoppedSaves(t *testing.T, d *daemon, netCheck func(vm string)) {
	const vm = "r3"
	d.must("create", vm, "--memory", "256M")
	d.must("exec", vm, "--", "sh", "-c", "echo before > /root/file; sync")
	if id := strings.TrimSpace(d.must("checkpoint", vm)); id != "cp-1" {
		t.Fatalf("first checkpoint %q", id)
	}
	d.must("exec", vm, "--", "sh", "-c", "echo after > /root/file; sync")
	ip := d.netInfo(vm).IP
	pids := d.vmmPIDs(vm)
	if len(pids) == 0 {
		t.Fatal("no qemu for the vm")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	if !eventually(60*time.Second, func() bool { return d.info(vm).State == "stopped" }) {
		t.Fatalf("den did not notice its vmm died: %+v", d.info(vm))
	}

	d.must("restore", vm, "cp-1")
	if out := d.must("exec", vm, "--", "cat", "/root/file"); out != "before\n" {
		t.Fatalf("after the restore to cp-1: %q", out)
	}
	var cps []struct {
		ID, Parent, Kind, Comment string
	}
	if err := json.Unmarshal([]byte(d.must("checkpoints", vm, "--json")), &cps); err != nil {
		t.Fatal(err)
	}
	saved := ""
	for _, cp := range cps {
		if cp.Comment == "auto: before restore to cp-1" {
			if cp.Kind != "disk-only" || cp.Parent != "cp-1" {
				t.Fatalf("the saved state: %+v, want a disk-only child of cp-1", cp)
			}
			saved = cp.ID
		}
	}
	if saved == "" {
		t.Fatalf("restoring the stopped vm saved nothing: the file written after cp-1 is lost; checkpoints %+v", cps)
	}
	d.must("restore", vm, saved, "--no-save")
	if out := d.must("exec", vm, "--", "cat", "/root/file"); out != "after\n" {
		t.Fatalf("after the restore to the saved %s: %q", saved, out)
	}
	if got := d.netInfo(vm).IP; got != ip {
		t.Fatalf("address %q after the restores, %q before", got, ip)
	}
	if netCheck != nil {
		netCheck(vm)
	}
}
