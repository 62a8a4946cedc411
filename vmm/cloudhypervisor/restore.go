package cloudhypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/vmm"
)

// snapshotConfigFile is the VM config inside a snapshot directory.
const snapshotConfigFile = "config.json"

// Snapshot writes the state of the paused VM (devices and memory) into
// dir (vm.snapshot), which must exist; Cloud Hypervisor writes
// config.json, state.json and a sparse memory-ranges there. The VM stays
// paused. A running VM is refused with an error wrapping
// vmm.ErrInvalidState.
func (v *VMM) Snapshot(ctx context.Context, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("ch snapshot: %w", err)
	}
	if u := v.opts.Confine.User; u != nil {
		// The VMM writes the snapshot's files itself.
		if err := u.Own(abs); err != nil {
			return fmt.Errorf("ch snapshot: %w", err)
		}
	}
	return v.call(ctx, http.MethodPut, "vm.snapshot", VmSnapshotConfig{DestinationURL: "file://" + abs}, nil)
}

// Restore brings the VM of snapshot dir back into this VMM, which must
// have no VM (a fresh process: vm.info answers 404). Memory is copied in,
// or with opts.OnDemand mapped lazily through userfaultfd; then the
// snapshot's memory-ranges is read for as long as the VM runs, so it must
// not be deleted before the VM stops or is snapshotted again.
//
// The snapshot's config.json records host paths. When they do not fit this
// VM (opts.Config names other disks or taps, or the vsock socket or serial
// file lie outside this run directory), Restore leaves dir untouched and
// restores from a private directory under the run directory: links to the
// snapshot's files and a rewritten config.json.
//
// Guest connections made before (DialGuest) do not survive: redial.
func (v *VMM) Restore(ctx context.Context, dir string, opts vmm.RestoreOptions) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	// Cloud Hypervisor reads the whole snapshot in its restore call.
	if err := opts.WaitVerified(); err != nil {
		return fmt.Errorf("ch restore: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("ch restore: %w", err)
	}
	conf, err := v.planRestore(abs, opts.Config)
	if err != nil {
		return fmt.Errorf("ch restore: %w", err)
	}
	info, err := v.Info(ctx)
	if err != nil {
		return fmt.Errorf("ch restore: %w", err)
	}
	if info.State != vmm.StateNotCreated {
		return fmt.Errorf("ch restore: this vmm already has a vm (%s); restore needs a fresh vmm: %w", info.State, vmm.ErrInvalidState)
	}
	src := abs
	if conf != nil {
		if src, err = v.makeRestoreDir(abs, conf); err != nil {
			return fmt.Errorf("ch restore: %w", err)
		}
	}
	mode := RestoreCopy
	if opts.OnDemand {
		mode = RestoreOnDemand
	}
	removeStaleSocket(v.opts.RunDir.VsockSocket())
	if err := opts.WaitDisks(); err != nil {
		return fmt.Errorf("ch restore: %w", err)
	}
	if opts.Config != nil {
		if err := v.grantDisks(opts.Config.Disks); err != nil {
			return fmt.Errorf("ch restore: %w", err)
		}
	}
	req := RestoreConfig{SourceURL: "file://" + src, MemoryRestoreMode: mode, Resume: opts.Resume}
	if err := v.call(ctx, http.MethodPut, "vm.restore", req, nil); err != nil {
		return err
	}
	if opts.Config != nil {
		v.saveConfig(*opts.Config)
	}
	v.log.Info("restored", "from", abs, "via", src, "mode", mode, "resume", opts.Resume)
	return nil
}

// restoreDir is where Restore builds a snapshot with rewritten paths.
func (v *VMM) restoreDir() string {
	return filepath.Join(v.opts.RunDir.Path(), "restore")
}

// planRestore reads the snapshot's config.json and rewrites it for this
// VM. It returns nil when the snapshot fits as it is (or has no readable
// config.json and there is nothing to rewrite, so that Cloud Hypervisor's
// own error reaches the caller); it writes nothing.
func (v *VMM) planRestore(dir string, cfg *vmm.Config) (map[string]any, error) {
	raw, err := os.ReadFile(filepath.Join(dir, snapshotConfigFile))
	if err != nil {
		if cfg == nil {
			return nil, nil
		}
		return nil, fmt.Errorf("read snapshot config: %w", err)
	}
	conf, err := decodeObject(raw)
	if err != nil {
		return nil, fmt.Errorf("snapshot config %s: %w", filepath.Join(dir, snapshotConfigFile), err)
	}
	changed, err := v.rewriteConfig(conf, v.opts.RunDir, cfg)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	if !changed {
		return nil, nil
	}
	if filepath.Clean(dir) == v.restoreDir() {
		return nil, fmt.Errorf("cannot restore from %s: it is this vm's private restore directory", dir)
	}
	return conf, nil
}

// makeRestoreDir fills the private restore directory: links to dir's
// files and the rewritten config conf.
func (v *VMM) makeRestoreDir(dir string, conf map[string]any) (string, error) {
	priv := v.restoreDir()
	if err := os.RemoveAll(priv); err != nil {
		return "", err
	}
	if err := os.MkdirAll(priv, 0o750); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.Name() == snapshotConfigFile {
			continue
		}
		if err := linkOrSymlink(filepath.Join(dir, e.Name()), filepath.Join(priv, e.Name())); err != nil {
			return "", err
		}
	}
	data, err := json.MarshalIndent(conf, "", "    ")
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(filepath.Join(priv, snapshotConfigFile), data, 0o640); err != nil {
		return "", err
	}
	return priv, nil
}

// linkOrSymlink hard-links src to dst (so the data outlives a deletion of
// the snapshot), or symlinks it where a hard link is impossible (another
// filesystem: snapshots live on the shared volume, run dirs locally).
func linkOrSymlink(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	if err := os.Symlink(src, dst); err != nil {
		return fmt.Errorf("link snapshot file: %w", err)
	}
	return nil
}

// decodeObject decodes a JSON object keeping numbers exact, so that a
// rewritten config.json differs from the original only where rewritten.
func decodeObject(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("not a json object")
	}
	return m, nil
}

// rewriteConfig points a snapshot's config (as generic JSON, so that
// fields den does not know survive) at this VM: the vsock socket and the
// serial file into rd, and with cfg its disks, taps, MACs and payload.
// cfg's CPU count and memory size must match the snapshot's; the vsock
// CID stays the snapshot's (the guest holds it in its state). It reports
// whether anything changed.
func (v *VMM) rewriteConfig(conf map[string]any, rd vmm.RunDir, cfg *vmm.Config) (bool, error) {
	changed := false
	if vs, ok := conf["vsock"].(map[string]any); ok {
		changed = setString(vs, "socket", rd.VsockSocket()) || changed
	}
	if se, ok := conf["serial"].(map[string]any); ok && se["mode"] == string(ConsoleFile) {
		changed = setString(se, "file", rd.ConsoleLog()) || changed
	}
	if on, rules := v.landlock(); on || conf["landlock_enable"] == true {
		// A snapshot records the landlock of the VMM that took it: the
		// restoring VMM gets its own rules.
		conf["landlock_enable"], conf["landlock_rules"] = on, rules
		changed = true
	}
	if cfg == nil {
		return changed, nil
	}
	if cpus, ok := conf["cpus"].(map[string]any); ok && cfg.CPUs != 0 {
		if n := jsonInt(cpus["boot_vcpus"]); n != int64(cfg.CPUs) {
			return false, fmt.Errorf("snapshot has %d vcpus, config wants %d: a restore cannot change them", n, cfg.CPUs)
		}
	}
	if mem, ok := conf["memory"].(map[string]any); ok && cfg.MemoryBytes != 0 {
		if n := jsonInt(mem["size"]); n != cfg.MemoryBytes {
			return false, fmt.Errorf("snapshot has %d bytes of memory, config wants %d: a restore cannot change it", n, cfg.MemoryBytes)
		}
	}
	if pl, ok := conf["payload"].(map[string]any); ok {
		if cfg.Kernel != "" {
			changed = setString(pl, "kernel", cfg.Kernel) || changed
		}
		if cfg.Initramfs != "" {
			changed = setString(pl, "initramfs", cfg.Initramfs) || changed
		}
	}
	disks, _ := conf["disks"].([]any)
	ids := make([]string, len(cfg.Disks))
	for i, d := range cfg.Disks {
		ids[i] = d.ID
	}
	err := matchDevices("disk", disks, ids, func(dev map[string]any, i int) {
		changed = setString(dev, "path", cfg.Disks[i].Path) || changed
	})
	if err != nil {
		return false, err
	}
	nets, _ := conf["net"].([]any)
	ids = make([]string, len(cfg.Net))
	for i, n := range cfg.Net {
		ids[i] = n.ID
	}
	err = matchDevices("net", nets, ids, func(dev map[string]any, i int) {
		if cfg.Net[i].Tap != "" {
			changed = setString(dev, "tap", cfg.Net[i].Tap) || changed
		}
		if cfg.Net[i].MAC != "" {
			changed = setString(dev, "mac", cfg.Net[i].MAC) || changed
		}
	})
	return changed, err
}

// matchDevices pairs a snapshot's devices with the config's (by id, else
// by position for a config device without id) and calls set for each
// pair. A restore cannot add or remove devices, so the counts must agree.
func matchDevices(kind string, devs []any, ids []string, set func(dev map[string]any, i int)) error {
	if len(devs) != len(ids) {
		return fmt.Errorf("snapshot has %d %s devices, config has %d: a restore cannot add or remove devices", len(devs), kind, len(ids))
	}
	used := make([]bool, len(ids))
	for pos, d := range devs {
		dev, ok := d.(map[string]any)
		if !ok {
			return fmt.Errorf("snapshot %s device %d is not an object", kind, pos)
		}
		id, _ := dev["id"].(string)
		match := -1
		for i, cid := range ids {
			if !used[i] && id != "" && cid == id {
				match = i
				break
			}
		}
		if match < 0 && !used[pos] && ids[pos] == "" {
			match = pos
		}
		if match < 0 {
			return fmt.Errorf("snapshot %s device %q has no counterpart in the config", kind, id)
		}
		used[match] = true
		set(dev, match)
	}
	return nil
}

// setString sets m[key] to val and reports whether that changed it.
func setString(m map[string]any, key, val string) bool {
	if old, ok := m[key].(string); ok && old == val {
		return false
	}
	m[key] = val
	return true
}

// jsonInt reads an integer decoded with UseNumber (-1 if it is not one).
func jsonInt(v any) int64 {
	n, ok := v.(json.Number)
	if !ok {
		return -1
	}
	i, err := n.Int64()
	if err != nil {
		return -1
	}
	return i
}
