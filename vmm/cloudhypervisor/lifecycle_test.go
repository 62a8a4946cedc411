package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// TestLifecycleReplay drives the driver through the first VMM of the main
// transcript: every state change and every error it recorded.
func TestLifecycleReplay(t *testing.T) {
	v, rd := newTestVMM(t)
	r := startReplay(t, rd.APISocket(), segment(t, mainTranscript, 0)...)
	ctx := testCtx(t, 30*time.Second)

	ping, err := v.Ping(ctx)
	must(t, "ping", err)
	if ping.Version != "54.0.0" || v.Capabilities().Version != "v53.0-246-gae44c2971-dirty" {
		t.Errorf("ping %+v, capabilities version %q", ping, v.Capabilities().Version)
	}

	wantState(t, ctx, v, vmm.StateNotCreated)

	wantErr(t, v.Boot(ctx), 404,
		"ch boot: 404: Error from API: The VM could not boot: VM config is missing", true)

	// A body that does not deserialize: serde's message survives.
	wantErr(t, raw(ctx, v, http.MethodPut, "vm.create", map[string]any{"cpus": map[string]any{"boot_vcpus": 0}}), 400,
		"ch create: 400: Failed to deserialize JSON: missing field `max_vcpus` at line 1 column 26", false)

	cfg := transcriptConfig()
	must(t, "create", v.Create(ctx, cfg))
	body := r.last(t, pathPut("vm.create"))
	checkCreateBody(t, body, rd)
	var saved vmm.Config
	data, err := os.ReadFile(rd.ConfigFile())
	must(t, "read config file", err)
	must(t, "decode config file", json.Unmarshal(data, &saved))
	if saved.Kernel != cfg.Kernel || len(saved.Disks) != 1 {
		t.Errorf("config file holds %+v", saved)
	}

	wantErr(t, v.Create(ctx, cfg), 500,
		"ch create: 500: Error from API: The VM could not be created: VM is already created", true)

	info := wantState(t, ctx, v, vmm.StateCreated)
	if info.CPUs != 1 || info.MemoryBytes != 256<<20 {
		t.Errorf("info %+v", info)
	}
	must(t, "boot", v.Boot(ctx))
	wantState(t, ctx, v, vmm.StateRunning)

	wantErr(t, v.Resume(ctx), 500,
		"ch resume: 500: Error from API: The VM could not resume: Cannot resume VM: Failed to resume migratable component: Invalid transition: InvalidStateTransition(Running, Running)", true)
	wantErr(t, v.Snapshot(ctx, filepath.Join(rd.Path(), "cp1")), 500,
		"ch snapshot: 500: Error from API: The VM could not be snapshotted: Cannot snapshot VM: Failed to snapshot migratable component: Trying to snapshot while VM is running", true)

	must(t, "pause", v.Pause(ctx))
	wantErr(t, v.Pause(ctx), 500,
		"ch pause: 500: Error from API: The VM could not be paused: Cannot pause VM: Failed to pause migratable component: Invalid transition: InvalidStateTransition(Paused, Paused)", true)
	wantState(t, ctx, v, vmm.StatePaused)

	counters, err := v.Counters(ctx)
	must(t, "counters", err)
	if counters["root"]["read_latency_min"] != math.MaxUint64 || counters["root"]["read_bytes"] != 0 {
		t.Errorf("counters %v", counters)
	}

	wantErr(t, raw(ctx, v, http.MethodPut, "vm.resize", map[string]any{"desired_ram": 512 << 20}), 500,
		"ch resize: 500: Error from API: The VM could not be resized: Memory manager error: Not enough space in the hotplug RAM region", false)

	must(t, "resume", v.Resume(ctx))
	must(t, "vm.shutdown", raw(ctx, v, http.MethodPut, "vm.shutdown", nil))
	wantState(t, ctx, v, vmm.StateCreated)
	must(t, "vm.delete", raw(ctx, v, http.MethodPut, "vm.delete", nil))
	wantState(t, ctx, v, vmm.StateNotCreated)

	// Shutdown without a process: vm.shutdown (refused: no VM, ignored),
	// then vmm.shutdown, after which the socket is gone.
	must(t, "shutdown", v.Shutdown(ctx))
	if u := r.unused(); len(u) > 0 {
		t.Errorf("recorded but never requested: %v", u)
	}
	if u := r.unexpectedRequests(); !slices.Equal(u, []string{pathPut("vm.shutdown")}) {
		t.Errorf("unexpected requests %v, want only Shutdown's best-effort vm.shutdown", u)
	}
	_, err = v.Info(ctx)
	if !errors.Is(err, vmm.ErrNotRunning) || !strings.Contains(err.Error(), rd.APISocket()) {
		t.Errorf("info after shutdown: %v, want ErrNotRunning naming the socket", err)
	}
}

// checkCreateBody checks the vm.create body den sends.
func checkCreateBody(t *testing.T, body map[string]any, rd vmm.RunDir) {
	t.Helper()
	get := func(path ...string) any {
		var cur any = body
		for _, p := range path {
			m, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = m[p]
		}
		return cur
	}
	checks := []struct {
		path []string
		want any
	}{
		{[]string{"cpus", "boot_vcpus"}, json.Number("1")},
		{[]string{"cpus", "max_vcpus"}, json.Number("1")},
		{[]string{"cpus", "nested"}, false},
		{[]string{"memory", "size"}, json.Number("268435456")},
		{[]string{"memory", "shared"}, true},
		{[]string{"memory", "hugepages"}, false},
		{[]string{"payload", "kernel"}, "/var/lib/den/images/debian-12/vmlinuz"},
		{[]string{"payload", "initramfs"}, "/var/lib/den/images/debian-12/initrd.img"},
		{[]string{"payload", "cmdline"}, "console=ttyS0 panic=-1"},
		{[]string{"serial", "mode"}, "File"},
		{[]string{"serial", "file"}, rd.ConsoleLog()},
		{[]string{"console", "mode"}, "Off"},
		{[]string{"vsock", "cid"}, json.Number("3")},
		{[]string{"vsock", "socket"}, rd.VsockSocket()},
	}
	for _, c := range checks {
		if got := get(c.path...); got != c.want {
			t.Errorf("create body %s = %v, want %v", strings.Join(c.path, "."), got, c.want)
		}
	}
	disks, _ := body["disks"].([]any)
	if len(disks) != 1 || disks[0].(map[string]any)["id"] != "root" {
		t.Errorf("create body disks %v", disks)
	}
}

func TestConfigMapping(t *testing.T) {
	v, rd := newTestVMM(t)
	cfg := transcriptConfig()
	cfg.CPUs = 2
	cfg.GuestCID = 7
	cfg.Disks = append(cfg.Disks, vmm.Disk{ID: "base", Path: "/x/base.raw", ReadOnly: true})
	cfg.Net = []vmm.Net{{ID: "eth0", Tap: "den-tap0", MAC: "52:54:00:12:34:56"}}
	got, err := v.vmConfig(cfg)
	must(t, "map config", err)
	if got.Cpus.BootVcpus != 2 || got.Cpus.MaxVcpus != 2 || got.Vsock.CID != 7 || got.Vsock.Socket != rd.VsockSocket() {
		t.Errorf("cpus %+v vsock %+v", got.Cpus, got.Vsock)
	}
	if !got.Disks[1].Readonly || got.Disks[1].ID != "base" || got.Net[0].Tap != "den-tap0" || got.Net[0].MAC != "52:54:00:12:34:56" {
		t.Errorf("disks %+v net %+v", got.Disks, got.Net)
	}

	bad := transcriptConfig()
	bad.Net = []vmm.Net{{ID: "eth0"}}
	if _, err := v.vmConfig(bad); err == nil || !strings.Contains(err.Error(), "no tap") {
		t.Errorf("net without tap: %v", err)
	}
	bad = transcriptConfig()
	bad.CPUs = 0
	if _, err := v.vmConfig(bad); err == nil {
		t.Error("0 cpus accepted")
	}
	bad = transcriptConfig()
	bad.GuestCID = 2
	if _, err := v.vmConfig(bad); err == nil {
		t.Error("cid 2 accepted")
	}
}

func TestCapabilities(t *testing.T) {
	v, _ := newTestVMM(t)
	c := v.Capabilities()
	if c.Name != "cloud-hypervisor" || c.Accelerator != "kvm" || !c.Pause || !c.Snapshot || !c.OnDemandRestore ||
		c.GuestChannel != vmm.ChannelVsock || !c.MultiConn {
		t.Errorf("capabilities %+v", c)
	}
	if v.PID() != 0 || v.ExitErr() != nil {
		t.Errorf("pid %d, exit %v before start", v.PID(), v.ExitErr())
	}
	select {
	case <-v.Exited():
		t.Error("Exited closed before start")
	default:
	}
}

// TestCallDeadline: a VMM that accepts but never answers makes a call
// fail at its context's deadline.
func TestCallDeadline(t *testing.T) {
	v, rd := newTestVMM(t)
	listenSilent(t, rd.APISocket())
	ctx := testCtx(t, 200*time.Millisecond)
	start := time.Now()
	_, err := v.Info(ctx)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ch info: no answer from") {
		t.Fatalf("info from a silent socket: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %s", d)
	}
}

// Shutdown of a driver without a process fails when the socket still
// answers afterwards, and leaves the socket alone.
func TestShutdownWithoutProcess(t *testing.T) {
	v, rd := newTestVMM(t)
	listenSilent(t, rd.APISocket())
	start := time.Now()
	err := v.Shutdown(testCtx(t, 500*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "still answers") {
		t.Errorf("shutdown: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
	if _, err := os.Stat(rd.APISocket()); err != nil {
		t.Errorf("socket of a live vmm removed: %v", err)
	}
}

// TestLandlockConfig: with Options.Landlock the VM config turns landlock
// on with the run dir and the extra rules, and a restore gives the
// snapshot's config this VMM's rules.
func TestLandlockConfig(t *testing.T) {
	v, rd := newTestVMM(t)
	if got, err := v.vmConfig(transcriptConfig()); err != nil || got.LandlockEnable || got.LandlockRules != nil {
		t.Fatalf("landlock without asking: %+v %v", got, err)
	}
	v.opts.Landlock = true
	v.opts.LandlockRules = []LandlockConfig{{Path: "/vol/vms/a", Access: "rw"}}
	got, err := v.vmConfig(transcriptConfig())
	must(t, "map config", err)
	want := []LandlockConfig{{Path: rd.Path(), Access: "rw"}, {Path: "/vol/vms/a", Access: "rw"}}
	if !got.LandlockEnable || !reflect.DeepEqual(got.LandlockRules, want) {
		t.Fatalf("landlock %v %+v, want on %+v", got.LandlockEnable, got.LandlockRules, want)
	}
	conf := map[string]any{"landlock_enable": true, "landlock_rules": []any{map[string]any{"path": "/old", "access": "rw"}}}
	changed, err := v.rewriteConfig(conf, rd, nil)
	must(t, "rewrite", err)
	if !changed || conf["landlock_enable"] != true || !reflect.DeepEqual(conf["landlock_rules"], want) {
		t.Fatalf("restored config %+v", conf)
	}
}
