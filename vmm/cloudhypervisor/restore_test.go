package cloudhypervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// TestSnapshotReplay: the first VMM of the snapshot transcript: create,
// boot, pause, a snapshot into a missing directory (refused), a snapshot,
// then a restore into this VMM (refused: it has a VM).
func TestSnapshotReplay(t *testing.T) {
	v, rd := newTestVMM(t)
	r := startReplay(t, rd.APISocket(), segment(t, snapTranscript, 0)...)
	ctx := testCtx(t, 30*time.Second)

	must(t, "create", v.Create(ctx, transcriptConfig()))
	must(t, "boot", v.Boot(ctx))
	must(t, "pause", v.Pause(ctx))
	wantErr(t, v.Snapshot(ctx, filepath.Join(rd.Path(), "missing", "cp1")), 500,
		`ch snapshot: 500: Error from API: The VM could not be snapshotted: Cannot send VM snapshot: Failed to send migratable component snapshot: Destination is not a directory: "/var/lib/den/vms/demo/checkpoints/missing/cp1"`, false)
	cp := filepath.Join(rd.Path(), "cp1")
	must(t, "mkdir", os.Mkdir(cp, 0o755))
	must(t, "snapshot", v.Snapshot(ctx, cp))
	if got := r.last(t, pathPut("vm.snapshot"))["destination_url"]; got != "file://"+cp {
		t.Errorf("destination_url %v, want file://%s", got, cp)
	}

	// Restore asks vm.info first and refuses without sending vm.restore.
	err := v.Restore(ctx, cp, vmm.RestoreOptions{})
	if !errors.Is(err, vmm.ErrInvalidState) || !strings.Contains(err.Error(), "already has a vm (Paused)") {
		t.Errorf("restore into a vmm with a vm: %v", err)
	}
	// Cloud Hypervisor's own refusal has the same meaning.
	wantErr(t, raw(ctx, v, http.MethodPut, "vm.restore", RestoreConfig{SourceURL: "file://" + cp}), 500,
		"ch restore: 500: Error from API: The VM could not be restored: VM is already created", true)
	must(t, "resume", v.Resume(ctx))
	must(t, "shutdown", v.Shutdown(ctx))
	if u := r.unused(); len(u) > 0 {
		t.Errorf("recorded but never requested: %v", u)
	}
}

// fakeSnapshot makes a snapshot directory: the recorded config.json (its
// paths are the recording host's) and small stand-ins for state.json and
// memory-ranges.
func fakeSnapshot(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(shortDir(t), "cp1")
	must(t, "mkdir", os.Mkdir(dir, 0o755))
	conf, err := os.ReadFile("testdata/snapshot-config.json")
	must(t, "read recorded config", err)
	writeFile(t, filepath.Join(dir, "config.json"), conf)
	writeFile(t, filepath.Join(dir, "state.json"), []byte(`{"snapshots":{}}`))
	writeFile(t, filepath.Join(dir, "memory-ranges"), bytes.Repeat([]byte{0xaa}, 4096))
	return dir
}

// dirContents maps each file of dir to its content.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	es, err := os.ReadDir(dir)
	must(t, "read dir", err)
	out := map[string]string{}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		must(t, "read", err)
		out[e.Name()] = string(b)
	}
	return out
}

// TestRestoreReplay restores into fresh VMMs (fresh replays of the
// recorded restores) in both memory modes.
func TestRestoreReplay(t *testing.T) {
	cases := []struct {
		name     string
		entries  func(t *testing.T) []entry
		opts     vmm.RestoreOptions
		mode     string
		resumed  bool
		prefault bool
	}{
		{"copy", func(t *testing.T) []entry { return segment(t, snapTranscript, 1) },
			vmm.RestoreOptions{}, "Copy", false, false},
		{"ondemand", func(t *testing.T) []entry { return segment(t, snapTranscript, 2) },
			vmm.RestoreOptions{OnDemand: true}, "OnDemand", false, false},
		// The recording went straight to vm.restore here; Restore asks
		// vm.info first, answered with the recorded 404.
		{"ondemand-resume", func(t *testing.T) []entry {
			return append([]entry{info404(t)}, segment(t, snapTranscript, 3)...)
		}, vmm.RestoreOptions{OnDemand: true, Resume: true}, "OnDemand", true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap := fakeSnapshot(t)
			before := dirContents(t, snap)
			v, rd := newTestVMM(t)
			r := startReplay(t, rd.APISocket(), c.entries(t)...)
			ctx := testCtx(t, 30*time.Second)

			if c.prefault {
				wantErr(t, raw(ctx, v, http.MethodPut, "vm.restore",
					RestoreConfig{SourceURL: "file://" + snap, MemoryRestoreMode: RestoreOnDemand, Prefault: true}), 400,
					"ch restore: 400: Error from API: The VM could not be restored: Failed to validate config: 'prefault' cannot be combined with 'memory_restore_mode=ondemand'", false)
			}
			must(t, "restore", v.Restore(ctx, snap, c.opts))
			body := r.last(t, pathPut("vm.restore"))
			if body["memory_restore_mode"] != c.mode || body["resume"] != c.resumed {
				t.Errorf("restore body %v", body)
			}
			// The recorded config's paths are not this run dir's: the
			// restore went through the private directory.
			priv := filepath.Join(rd.Path(), "restore")
			if body["source_url"] != "file://"+priv {
				t.Errorf("source_url %v, want file://%s", body["source_url"], priv)
			}
			checkPrivateDir(t, snap, priv, rd)
			if after := dirContents(t, snap); !mapsEqual(before, after) {
				t.Error("the snapshot directory was modified")
			}

			if c.resumed {
				wantState(t, ctx, v, vmm.StateRunning)
			} else {
				wantState(t, ctx, v, vmm.StatePaused)
				must(t, "resume", v.Resume(ctx))
				wantState(t, ctx, v, vmm.StateRunning)
			}
			must(t, "shutdown", v.Shutdown(ctx))
			if _, err := os.Stat(priv); !os.IsNotExist(err) {
				t.Errorf("private restore dir left after shutdown: %v", err)
			}
			if u := r.unused(); len(u) > 0 {
				t.Errorf("recorded but never requested: %v", u)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// checkPrivateDir: links to the snapshot's files, and a config.json whose
// vsock socket and serial file are rd's, everything else as recorded.
func checkPrivateDir(t *testing.T, snap, priv string, rd vmm.RunDir) {
	t.Helper()
	for _, f := range []string{"state.json", "memory-ranges"} {
		a, err := os.Stat(filepath.Join(snap, f))
		must(t, "stat", err)
		b, err := os.Stat(filepath.Join(priv, f))
		must(t, "stat", err)
		if !os.SameFile(a, b) {
			t.Errorf("%s in the private dir is not a link to the snapshot's", f)
		}
	}
	orig := readConfig(t, filepath.Join(snap, "config.json"))
	got := readConfig(t, filepath.Join(priv, "config.json"))
	if s := got["vsock"].(map[string]any)["socket"]; s != rd.VsockSocket() {
		t.Errorf("vsock socket %v, want %s", s, rd.VsockSocket())
	}
	if s := got["serial"].(map[string]any)["file"]; s != rd.ConsoleLog() {
		t.Errorf("serial file %v, want %s", s, rd.ConsoleLog())
	}
	// Everything else is kept, numbers exactly.
	got["vsock"].(map[string]any)["socket"] = orig["vsock"].(map[string]any)["socket"]
	got["serial"].(map[string]any)["file"] = orig["serial"].(map[string]any)["file"]
	a, _ := json.Marshal(orig)
	b, _ := json.Marshal(got)
	if !bytes.Equal(a, b) {
		t.Errorf("config.json changed beyond the paths:\n%s\n%s", a, b)
	}
}

func readConfig(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	must(t, "read config", err)
	m, err := decodeObject(data)
	must(t, "decode config", err)
	return m
}

// TestRestoreDirect: a snapshot whose paths already are this run dir's is
// restored from where it is.
func TestRestoreDirect(t *testing.T) {
	snap := fakeSnapshot(t)
	v, rd := newTestVMM(t)
	conf := readConfig(t, filepath.Join(snap, "config.json"))
	conf["vsock"].(map[string]any)["socket"] = rd.VsockSocket()
	conf["serial"].(map[string]any)["file"] = rd.ConsoleLog()
	data, _ := json.Marshal(conf)
	writeFile(t, filepath.Join(snap, "config.json"), data)

	r := startReplay(t, rd.APISocket(), segment(t, snapTranscript, 1)...)
	ctx := testCtx(t, 30*time.Second)
	must(t, "restore", v.Restore(ctx, snap, vmm.RestoreOptions{}))
	if got := r.last(t, pathPut("vm.restore"))["source_url"]; got != "file://"+snap {
		t.Errorf("source_url %v, want file://%s", got, snap)
	}
	if _, err := os.Stat(filepath.Join(rd.Path(), "restore")); !os.IsNotExist(err) {
		t.Errorf("a private restore dir was made: %v", err)
	}
}

// TestRestoreAsFork: with a config, the disks and payload move to the
// fork's paths; sizes must match and devices cannot be added.
func TestRestoreAsFork(t *testing.T) {
	snap := fakeSnapshot(t)
	v, rd := newTestVMM(t)
	startReplay(t, rd.APISocket(), segment(t, snapTranscript, 1)...)
	ctx := testCtx(t, 30*time.Second)

	fork := transcriptConfig()
	fork.Disks[0].Path = "/var/lib/den/vms/fork/disk.raw"
	fork.Kernel = "/var/lib/den/images/debian-12b/vmlinuz"

	for _, bad := range []struct {
		name   string
		change func(c *vmm.Config)
		want   string
	}{
		{"cpus", func(c *vmm.Config) { c.CPUs = 2 }, "snapshot has 1 vcpus, config wants 2"},
		{"memory", func(c *vmm.Config) { c.MemoryBytes = 512 << 20 }, "cannot change it"},
		{"disks", func(c *vmm.Config) { c.Disks = append(c.Disks, vmm.Disk{ID: "data", Path: "/d"}) }, "has 1 disk devices, config has 2"},
		{"disk id", func(c *vmm.Config) { c.Disks[0].ID = "other" }, `disk device "root" has no counterpart`},
		{"net", func(c *vmm.Config) { c.Net = []vmm.Net{{ID: "eth0", Tap: "t0"}} }, "has 0 net devices, config has 1"},
	} {
		c := fork
		c.Disks = append([]vmm.Disk(nil), fork.Disks...)
		bad.change(&c)
		err := v.Restore(ctx, snap, vmm.RestoreOptions{Config: &c})
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.name, err, bad.want)
		}
	}

	must(t, "restore fork", v.Restore(ctx, snap, vmm.RestoreOptions{Config: &fork}))
	got := readConfig(t, filepath.Join(rd.Path(), "restore", "config.json"))
	disk := got["disks"].([]any)[0].(map[string]any)
	if disk["path"] != fork.Disks[0].Path || disk["id"] != "root" || disk["queue_size"] != json.Number("128") {
		t.Errorf("disk %v", disk)
	}
	if k := got["payload"].(map[string]any)["kernel"]; k != fork.Kernel {
		t.Errorf("kernel %v", k)
	}
	orig := readConfig(t, filepath.Join(snap, "config.json"))
	if d := orig["disks"].([]any)[0].(map[string]any)["path"]; d != "/run/den/vms/demo/disk.raw" {
		t.Errorf("snapshot config changed: disk %v", d)
	}
	var saved vmm.Config
	data, err := os.ReadFile(rd.ConfigFile())
	must(t, "read config file", err)
	must(t, "decode", json.Unmarshal(data, &saved))
	if saved.Disks[0].Path != fork.Disks[0].Path {
		t.Errorf("config file %+v", saved)
	}
}

// TestRestoreErrorsReplay: the main transcript's second VMM: a restore
// from a missing directory, and a memory mode that does not exist.
func TestRestoreErrorsReplay(t *testing.T) {
	v, rd := newTestVMM(t)
	r := startReplay(t, rd.APISocket(), append([]entry{info404(t)}, segment(t, mainTranscript, 1)...)...)
	ctx := testCtx(t, 30*time.Second)
	missing := filepath.Join(rd.Path(), "checkpoints", "missing")
	err := v.Restore(ctx, missing, vmm.RestoreOptions{OnDemand: true, Resume: true})
	wantErr(t, err, 500,
		`ch restore: 500: Error from API: The VM could not be restored: Cannot restore VM: Failed to send migratable component snapshot: Destination is not a directory: "/var/lib/den/vms/demo/checkpoints/missing"`, false)
	if got := r.last(t, pathPut("vm.restore"))["source_url"]; got != "file://"+missing {
		t.Errorf("source_url %v", got)
	}
	wantErr(t, raw(ctx, v, http.MethodPut, "vm.restore", map[string]any{"source_url": "file://" + missing, "memory_restore_mode": "Bogus"}), 400,
		"ch restore: 400: Failed to deserialize JSON: unknown variant `Bogus`, expected `Copy` or `OnDemand` at line 1 column 83", false)
	must(t, "shutdown", v.Shutdown(ctx))
	if u := r.unused(); len(u) > 0 {
		t.Errorf("recorded but never requested: %v", u)
	}
}
