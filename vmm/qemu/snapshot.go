package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/vmm"
)

// MemoryFile is the guest RAM's copy in a QEMU snapshot directory (none
// when the RAM went into the state stream), and MemoryMapFile the list of
// its data ranges (JSON sparse.Extent: a FUSE volume cannot tell holes).
const (
	MemoryFile    = snapMemory
	MemoryMapFile = snapExtent
)

// Files of a QEMU snapshot directory.
const (
	snapState  = "state"       // device state (migration stream, RAM excluded)
	snapMemory = "memory"      // copy of the guest RAM file (sparse)
	snapExtent = "memory.map"  // its data ranges, for filesystems that cannot tell holes
	snapConfig = "config.json" // the vmm.Config the VM ran with
	snapMeta   = "qemu.json"   // driver, version, accelerator
)

var (
	_ vmm.Hypervisor       = (*VMM)(nil)
	_ vmm.DeltaSnapshotter = (*VMM)(nil)
	_ vmm.MemoryKeeper     = (*VMM)(nil)
)

// snapshotMeta records what a snapshot needs to be restored.
type snapshotMeta struct {
	Driver  string `json:"driver"`
	Version string `json:"version"`
	Accel   string `json:"accel"`
	// RAMInStream: the RAM went into the state stream (StreamRAM), there
	// is no memory file.
	RAMInStream bool `json:"ram_in_stream,omitempty"`
	// MemoryKept: the caller keeps the memory (SnapshotDevices); the
	// directory has its map but no memory file.
	MemoryKept bool `json:"memory_kept,omitempty"`
}

// Snapshot saves a paused VM into dir: device state by migration with
// x-ignore-shared (RAM is not streamed), then a sparse copy of the RAM
// file (synced) and its map, config and metadata (not synced: the caller
// syncs the directory once, where each fsync through the volume cost
// 10-25 ms). The VM stays paused.
func (v *VMM) Snapshot(ctx context.Context, dir string) error {
	return v.snapshot(ctx, dir, "", false)
}

// SnapshotDevices is Snapshot without the memory file: the caller keeps
// the memory, read from RAMFile while the VM stays paused
// (vmm.MemoryKeeper). The map of the RAM's data ranges is written.
func (v *VMM) SnapshotDevices(ctx context.Context, dir string) error {
	if v.opts.StreamRAM {
		return fmt.Errorf("snapshot vm: its RAM goes into the state stream, it has no file to keep")
	}
	return v.snapshot(ctx, dir, "", true)
}

// RAMFile is the guest's RAM file ("" when the RAM is in the state
// stream).
func (v *VMM) RAMFile() string {
	if v.opts.StreamRAM {
		return ""
	}
	return v.ramFile()
}

// MemoryRanges are the RAM file's data ranges the snapshot in dir
// recorded in its map (vmm.MemoryKeeper): those SnapshotDevices found.
func (v *VMM) MemoryRanges(dir string) ([]sparse.Extent, error) {
	data, err := os.ReadFile(filepath.Join(dir, snapExtent))
	if err != nil {
		return nil, fmt.Errorf("memory ranges: %w", err)
	}
	var ext []sparse.Extent
	if err := json.Unmarshal(data, &ext); err != nil {
		return nil, fmt.Errorf("memory ranges: corrupt %s: %w", snapExtent, err)
	}
	return ext, nil
}

// DeltaMemoryFile is the memory file SnapshotOver writes over; "" when
// the RAM goes into the state stream (Options.StreamRAM).
func (v *VMM) DeltaMemoryFile() string {
	if v.opts.StreamRAM {
		return ""
	}
	return snapMemory
}

// SnapshotOver is Snapshot into dir whose memory file is a clone of an
// earlier snapshot's memory, of which base is a local copy: only the
// pages of the RAM file that differ from base are written
// (sparse.CopyDelta). If that fails (base gone, or of another size), the
// memory is written whole.
func (v *VMM) SnapshotOver(ctx context.Context, dir, base string) error {
	return v.snapshot(ctx, dir, base, false)
}

func (v *VMM) snapshot(ctx context.Context, dir, base string, kept bool) error {
	if err := v.transition(ctx, "snapshot"); err != nil {
		return err
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("snapshot vm: destination %s is not a directory", dir)
	}
	state := filepath.Join(dir, snapState)
	if err := v.setIgnoreShared(ctx, !v.opts.StreamRAM); err != nil {
		return fmt.Errorf("snapshot vm: %w", err)
	}
	f, err := os.OpenFile(state, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot vm: %w", err)
	}
	end := phase.Begin(ctx, "qemu: device state")
	err = v.migrateFD(ctx, "migrate", f)
	if err == nil {
		err = v.waitMigration(ctx)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	end()
	if err != nil {
		return fmt.Errorf("snapshot vm: %w", err)
	}
	defer phase.Begin(ctx, "qemu: memory, map, config")()
	if !v.opts.StreamRAM {
		var ext []sparse.Extent
		if kept {
			ext, _, err = sparse.DataRanges(v.ramFile())
		} else {
			ext, err = v.copyMemoryOut(ctx, filepath.Join(dir, snapMemory), base)
		}
		if err != nil {
			return fmt.Errorf("snapshot vm: memory: %w", err)
		}
		// The snapshot usually lands on a FUSE volume, where SEEK_DATA
		// does not work: the map lets a restore read the data, not the
		// holes.
		if err := atomicfile.ReplaceJSON(filepath.Join(dir, snapExtent), ext, 0o600); err != nil {
			return fmt.Errorf("snapshot vm: %w", err)
		}
	}
	v.mu.Lock()
	cfg := *v.cfg
	v.mu.Unlock()
	if err := atomicfile.ReplaceJSON(filepath.Join(dir, snapConfig), cfg, 0o600); err != nil {
		return fmt.Errorf("snapshot vm: %w", err)
	}
	caps := v.Capabilities()
	meta := snapshotMeta{Driver: "qemu", Version: caps.Version, Accel: caps.Accelerator, RAMInStream: v.opts.StreamRAM, MemoryKept: kept}
	if err := atomicfile.ReplaceJSON(filepath.Join(dir, snapMeta), meta, 0o600); err != nil {
		return fmt.Errorf("snapshot vm: %w", err)
	}
	return nil
}

// copyMemoryOut copies the RAM file to dst, a snapshot's memory file:
// only the pages that differ from base when base is set (dst then holds
// what base holds), else whole; it returns the RAM file's data ranges.
func (v *VMM) copyMemoryOut(ctx context.Context, dst, base string) ([]sparse.Extent, error) {
	if base != "" {
		end := phase.Begin(ctx, "qemu: write the changed memory")
		ext, n, err := sparse.CopyDelta(v.ramFile(), dst, base)
		end()
		if err == nil {
			v.opts.Logger.Debug("qemu: snapshot memory written over the earlier one", "changed_bytes", n)
			return ext, nil
		}
		v.opts.Logger.Warn("qemu: snapshot memory: writing it whole", "err", err)
	}
	defer phase.Begin(ctx, "qemu: copy the memory")()
	return sparse.CopyExtents(v.ramFile(), dst)
}

// Restore starts a fresh QEMU on a copy of the snapshot's RAM file and
// loads the device state into it (-incoming defer, x-ignore-shared,
// migrate-incoming) once opts.Verified passed. The VM resumes when
// opts.Resume says so. QEMU has no
// lazy restore: opts.OnDemand is ignored (Capabilities.OnDemandRestore is
// false) and the cost is the sparse copy of the RAM the guest had used.
func (v *VMM) Restore(ctx context.Context, dir string, opts vmm.RestoreOptions) error {
	v.mu.Lock()
	pre := v.prelaunched
	v.prelaunched = ""
	v.mu.Unlock()
	if pre != "" {
		// A prelaunched QEMU (Prelaunch) maps the staged memory.
		if opts.StagedMemory != pre {
			_ = v.Shutdown(context.Background())
			return fmt.Errorf("restore vm: qemu was prelaunched with RAM file %s, the restore stages %q", pre, opts.StagedMemory)
		}
	} else if err := v.checkNoVM("restore"); err != nil {
		return err
	}
	cfg, meta, err := readSnapshot(dir, v.accelerator())
	if err != nil {
		return fmt.Errorf("restore vm from %s: %w", dir, err)
	}
	if opts.Config != nil {
		if opts.Config.CPUs != cfg.CPUs || opts.Config.MemoryBytes != cfg.MemoryBytes {
			return fmt.Errorf("restore vm from %s: sizes differ from the snapshot (%d cpus, %d bytes)", dir, cfg.CPUs, cfg.MemoryBytes)
		}
		cfg = *opts.Config
	}
	if err := os.MkdirAll(v.opts.RunDir.Path(), 0o700); err != nil {
		return fmt.Errorf("restore vm: %w", err)
	}
	// The memory is copied while QEMU starts: QEMU maps the RAM file
	// made here at its full size, and touches none of it before the
	// incoming migration (ROMs are not loaded into RAM while it waits
	// for one), which starts once the copy is over.
	copied := make(chan error, 1)
	ram := v.ramFile() // the file QEMU maps
	fill, step, err := memorySource(dir, meta, opts)
	if err != nil {
		return fmt.Errorf("restore vm from %s: %w", dir, err)
	}
	switch {
	case meta.RAMInStream:
		// The stream fills a fresh RAM file.
		_ = os.Remove(v.ramFile())
		copied <- nil
	case opts.StagedMemory != "":
		// QEMU maps the staged file while the caller fills it, as it maps
		// a copy being made here; it goes to the VMM's own path once QEMU
		// has it open. Should the staging fail, the copy is made in it.
		if err := checkRAMFile(opts.StagedMemory, cfg.MemoryBytes); err != nil {
			return fmt.Errorf("restore vm: memory: %w", err)
		}
		ram = opts.StagedMemory
		go func() {
			end := phase.Begin(ctx, "qemu: wait for the staged memory")
			err := opts.WaitStaged()
			end()
			if err != nil {
				defer phase.Begin(ctx, step+" (the staging failed)")()
				err = fill(ram)
			}
			copied <- err
		}()
	default:
		if err := makeRAMFile(v.ramFile(), cfg.MemoryBytes); err != nil {
			return fmt.Errorf("restore vm: memory: %w", err)
		}
		go func() {
			defer phase.Begin(ctx, step)()
			copied <- fill(v.ramFile())
		}()
	}
	waitCopy := func() error {
		defer phase.Begin(ctx, "qemu: wait for the memory")()
		if err := <-copied; err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		return nil
	}
	end := phase.Begin(ctx, "wait for the disks")
	err = opts.WaitDisks()
	end()
	switch {
	case err != nil:
	case pre == "":
		end = phase.Begin(ctx, "qemu: launch")
		err = v.launch(ctx, cfg, true, ram, nil)
		end()
	default:
		if !v.alive() {
			err = fmt.Errorf("prelaunched qemu: %w", v.notRunning("restore"))
		}
	}
	if err != nil {
		if pre != "" {
			_ = v.Shutdown(context.Background())
		}
		_ = waitCopy() // nothing writes the RAM file once this returns
		return fmt.Errorf("restore vm: %w", err)
	}
	fail := func(err error) error {
		_ = v.Shutdown(context.Background())
		return fmt.Errorf("restore vm from %s: %w", dir, err)
	}
	if err := waitCopy(); err != nil {
		if verr := opts.WaitVerified(); verr != nil {
			err = verr // a snapshot found damaged says so first
		}
		return fail(err)
	}
	if ram != v.ramFile() {
		if err := takeStaged(ram, v.ramFile()); err != nil {
			return fail(fmt.Errorf("memory: %w", err))
		}
	}
	if err := opts.WaitVerified(); err != nil {
		return fail(err)
	}
	if err := v.setIgnoreShared(ctx, !meta.RAMInStream); err != nil {
		return fail(err)
	}
	end = phase.Begin(ctx, "qemu: incoming migration")
	f, err := os.Open(filepath.Join(dir, snapState))
	if err != nil {
		end()
		return fail(err)
	}
	err = v.migrateFD(ctx, "migrate-incoming", f)
	if err == nil {
		err = v.waitIncoming(ctx)
	}
	f.Close()
	end()
	if err != nil {
		return fail(err)
	}
	v.mu.Lock()
	v.booted = true
	v.mu.Unlock()
	if opts.Resume {
		if _, err := v.call(ctx, "cont", nil); err != nil {
			return fail(err)
		}
	}
	return nil
}

// memorySource is how a restore fills the RAM file from the snapshot in
// dir: a copy of the local copy, or of the memory file, or the caller's
// fill of a memory it keeps; and the name of that step.
func memorySource(dir string, meta snapshotMeta, opts vmm.RestoreOptions) (fill func(dst string) error, step string, err error) {
	switch {
	case opts.LocalMemory != "":
		return func(dst string) error { return copyMemory(dir, opts.LocalMemory, dst) }, "qemu: copy memory (local copy)", nil
	case meta.MemoryKept && opts.FillMemory != nil:
		return opts.FillMemory, "qemu: fill memory (kept by content)", nil
	case meta.MemoryKept:
		return nil, "", errors.New("the snapshot's memory is kept outside it, and nothing fills it")
	}
	src := filepath.Join(dir, snapMemory)
	return func(dst string) error { return copyMemory(dir, src, dst) }, "qemu: copy memory", nil
}

// makeRAMFile makes the guest's RAM file empty (all holes) at its full
// size, for QEMU to map while copyMemory fills it.
func makeRAMFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// StageMemory makes dst, a RAM file of the snapshot's guest size, and
// starts filling it with the memory of the snapshot in dir, read from
// local (a local copy of the snapshot's memory file) or, when local is
// "", with fill when the snapshot's memory is kept outside it
// (vmm.MemoryKeeper), else from dir; wait waits for the copy (any number
// of times). A later
// Restore takes the file in place of a copy of its own
// (vmm.RestoreOptions.StagedMemory): the caller copies while it does other
// work, a restore while it verifies the checkpoint and stops the VM's
// running VMM. A snapshot with its RAM in the state stream has nothing to
// stage: an error.
func StageMemory(dir, local, dst string, fill func(dst string) error) (wait func() error, err error) {
	cfg, meta, err := readSnapshot(dir, "")
	if err != nil {
		return nil, fmt.Errorf("stage memory: %w", err)
	}
	if meta.RAMInStream {
		return nil, fmt.Errorf("stage memory: the snapshot in %s has its RAM in its state stream", dir)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return nil, fmt.Errorf("stage memory: %w", err)
	}
	copyTo, _, err := memorySource(dir, meta, vmm.RestoreOptions{LocalMemory: local, FillMemory: fill})
	if err != nil {
		return nil, fmt.Errorf("stage memory: %w", err)
	}
	if err := makeRAMFile(dst, cfg.MemoryBytes); err != nil {
		return nil, fmt.Errorf("stage memory: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- copyTo(dst) }()
	return sync.OnceValue(func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("stage memory: %w", err)
		}
		return nil
	}), nil
}

// checkRAMFile checks that the staged RAM file at path is the guest's
// size.
func checkRAMFile(path string, size int64) error {
	if st, err := os.Stat(path); err != nil || st.Size() != size {
		return fmt.Errorf("staged RAM file %s: not the guest's %d bytes (%v)", path, size, err)
	}
	return nil
}

// takeStaged moves a staged RAM file that QEMU has mapped to ram, the
// VMM's own path, where snapshots read it (QEMU maps the file, not the
// path).
func takeStaged(staged, ram string) error {
	if err := os.MkdirAll(filepath.Dir(ram), 0o700); err != nil {
		return err
	}
	return os.Rename(staged, ram)
}

// copyMemory copies src, the memory file of the snapshot in dir (or a
// local copy of it), into the RAM file dst, which makeRAMFile made (QEMU
// may have it mapped: it is written in place, never replaced): only the
// data ranges dir's map records when it has one, else the data a sparse
// read finds.
func copyMemory(dir, src, dst string) error {
	var ext []sparse.Extent
	if data, err := os.ReadFile(filepath.Join(dir, snapExtent)); err == nil {
		if err := json.Unmarshal(data, &ext); err != nil {
			return fmt.Errorf("corrupt %s: %w", snapExtent, err)
		}
	} else {
		ext = nil // no map: every data range of src
	}
	return sparse.CopyInto(src, dst, ext)
}

// readSnapshot checks a snapshot directory and returns its config and
// metadata.
func readSnapshot(dir, accel string) (vmm.Config, snapshotMeta, error) {
	var cfg vmm.Config
	var meta snapshotMeta
	for name, dst := range map[string]any{snapConfig: &cfg, snapMeta: &meta} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return cfg, meta, fmt.Errorf("not a qemu snapshot: %w", err)
		}
		if err := json.Unmarshal(data, dst); err != nil {
			return cfg, meta, fmt.Errorf("corrupt snapshot file %s: %w", name, err)
		}
	}
	if meta.Driver != "qemu" {
		return cfg, meta, fmt.Errorf("snapshot was taken by %q, not qemu", meta.Driver)
	}
	if accel != "" && meta.Accel != accel {
		return cfg, meta, fmt.Errorf("snapshot was taken under %s, this host uses %s", meta.Accel, accel)
	}
	files := []string{snapState}
	if !meta.RAMInStream && !meta.MemoryKept {
		files = append(files, snapMemory)
	}
	for _, name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return cfg, meta, fmt.Errorf("incomplete snapshot: %w", err)
		}
	}
	return cfg, meta, nil
}

// setIgnoreShared sets the x-ignore-shared migration capability: on, RAM
// (a shared file) stays out of the state stream.
func (v *VMM) setIgnoreShared(ctx context.Context, on bool) error {
	_, err := v.call(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}},
	})
	return err
}

// waitMigration polls query-migrate until the outgoing migration ends.
func (v *VMM) waitMigration(ctx context.Context) error {
	return v.poll(ctx, func() (bool, error) {
		ret, err := v.call(ctx, "query-migrate", nil)
		if err != nil {
			return false, err
		}
		var m struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(ret, &m); err != nil {
			return false, err
		}
		switch m.Status {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			// QEMU's own words: its error-desc, else the end of its log
			// (an I/O error on the snapshot file shows only there).
			desc := strings.TrimSpace(m.ErrorDesc)
			if desc == "" {
				desc = "no reason given; qemu log: " + vmm.TailFile(v.opts.RunDir.Log(), 300)
			}
			return false, fmt.Errorf("migration %s: %s (log %s)", m.Status, desc, v.opts.RunDir.Log())
		}
		return false, nil
	})
}

// waitIncoming polls query-status until the incoming migration is loaded.
func (v *VMM) waitIncoming(ctx context.Context) error {
	return v.poll(ctx, func() (bool, error) {
		ret, err := v.call(ctx, "query-status", nil)
		if err != nil {
			return false, err
		}
		var st struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(ret, &st); err != nil {
			return false, err
		}
		return st.Status != "inmigrate", nil
	})
}

// poll calls f every 5 ms until it is done, fails, or ctx (or
// vmm.DefaultCallTimeout) ends.
func (v *VMM) poll(ctx context.Context, f func() (bool, error)) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	for {
		done, err := f()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(errors.New("timed out waiting for qemu"), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// migrateFD runs a migration command (migrate, migrate-incoming) on a
// file the daemon opened: QEMU gets the fd over QMP (getfd) and migrates
// through it (uri fd:NAME), so it neither opens the snapshot by path nor
// spawns a process (its sandbox forbids both).
func (v *VMM) migrateFD(ctx context.Context, cmd string, f *os.File) error {
	const name = "den-migration"
	return v.session(ctx, cmd, func(ctx context.Context, q *qmpConn) error {
		if _, err := q.executeFD(ctx, "getfd", map[string]any{"fdname": name}, f); err != nil {
			return err
		}
		_, err := q.execute(ctx, cmd, map[string]any{"uri": "fd:" + name})
		if err != nil {
			_, _ = q.execute(ctx, "closefd", map[string]any{"fdname": name})
		}
		return err
	})
}
