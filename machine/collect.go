package machine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/memstore"
	"github.com/denhq/den/storage"
)

// collector removes what the memory store holds that no snapshot names
// any more (memkept.go): in the background, soon after a checkpoint, a
// slot, a base or a VM goes (poke), and every CollectEvery; or when asked
// (CollectGarbage). It rests after each pack it removes, so that a
// collection never takes the volume from the VMs.
type collector struct {
	m *Manager

	once sync.Once
	wake chan struct{}
	mu   sync.Mutex // one collection at a time
}

// Defaults of the collection.
const (
	// CollectEvery is how often the memory store is collected when
	// nothing asked sooner.
	CollectEvery = 30 * time.Minute
	// collectDelay gathers the deletions of a while into one collection.
	collectDelay = 5 * time.Second
	// collectPause is the rest after each pack removed.
	collectPause = 20 * time.Millisecond
)

// start runs the background collection until the Manager closes.
func (c *collector) start() {
	c.once.Do(func() { c.wake = make(chan struct{}, 1) })
	c.m.inBackground(func(ctx context.Context) {
		every(ctx, CollectEvery, c.wake, collectDelay, func(ctx context.Context) {
			if _, err := c.collect(ctx, false); err != nil && ctx.Err() == nil {
				c.m.log.Warn("den: collect the memory store", "err", err)
			}
		})
	})
}

// every runs f every interval, and delay after each signal on wake (nil:
// none), until ctx ends. The collection and the schedules run in it,
// each in the background (Manager.inBackground: until the Manager
// closes).
func every(ctx context.Context, interval time.Duration, wake <-chan struct{}, delay time.Duration, f func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
		}
		f(ctx)
	}
}

// poke asks for a collection soon: something that named extents went.
func (c *collector) poke() {
	c.once.Do(func() { c.wake = make(chan struct{}, 1) })
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// roots are the volume's directories that hold snapshots.
func (c *collector) roots() ([]string, error) {
	var out []string
	for _, p := range []storage.Path{storage.VMsDir(), storage.ImagesDir()} {
		host, err := c.m.vol.Path(p)
		if err != nil {
			return nil, err
		}
		out = append(out, host)
	}
	return out, nil
}

// collect runs one collection (dryRun: only says what would go).
func (c *collector) collect(ctx context.Context, dryRun bool) (memstore.Collected, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	store, err := c.m.snaps.memStore()
	if err != nil {
		return memstore.Collected{}, err
	}
	roots, err := c.roots()
	if err != nil {
		return memstore.Collected{}, err
	}
	got, err := store.Collect(ctx, roots, memstore.CollectOptions{DryRun: dryRun, Grace: c.m.cfg.CollectGrace, Pause: collectPause})
	if err == nil && !dryRun && (got.Removed > 0 || got.Temporary > 0) {
		c.m.log.Info("den: memory store collected", "packs_removed", got.Removed, "bytes", got.Bytes+got.Freed, "moved_bytes", got.Moved, "temporary", got.Temporary)
	}
	return got, err
}

// CollectGarbage collects the memory store now: the packs no snapshot
// names and older than the grace period go (dryRun: it only says which).
func (m *Manager) CollectGarbage(ctx context.Context, dryRun bool) (memstore.Collected, error) {
	got, err := m.gc.collect(ctx, dryRun)
	if err != nil {
		return got, fmt.Errorf("collect garbage: %w", err)
	}
	return got, nil
}

// StorageReport is what the snapshots' memory takes in the store: the
// store's totals, and per VM (and per checkpoint) what it references,
// what only it references, and what it shares.
type StorageReport struct {
	Stored  int64 `json:"stored_bytes"`
	Live    int64 `json:"live_bytes"`
	Garbage int64 `json:"garbage_bytes"`
	Packs   int   `json:"packs"`
	// VMs are the caller's VMs (every VM for an admin), by name.
	VMs []VMStorage `json:"vms"`
	// Bases is the warm bases' memory.
	Bases memstore.Usage `json:"bases"`
	// Disk is the data every disk file on the volume references (VMs',
	// checkpoints', images', spares'), each shared slice counted once.
	Disk int64 `json:"disk_bytes"`
}

// VMStorage is one VM's memory in the store.
type VMStorage struct {
	Name string `json:"name"`
	memstore.Usage
	// Disk is what its disks (its own and its checkpoints') reference,
	// hold alone and share (with a fork, an image, each other).
	Disk memstore.Usage `json:"disk"`
	// Checkpoints: what deleting each would free.
	Checkpoints []CheckpointStorage `json:"checkpoints,omitempty"`
}

// CheckpointStorage is what one checkpoint's memory takes.
type CheckpointStorage struct {
	ID         string `json:"id"`
	Referenced int64  `json:"referenced_bytes"`
	Frees      int64  `json:"frees_bytes"`
	// DiskFrees is the data only its disk holds.
	DiskFrees int64 `json:"disk_frees_bytes"`
}

// StorageUsage reports what the snapshots' memory takes in the memory
// store, and the VMs of owner (every VM when "") one by one.
func (m *Manager) StorageUsage(ctx context.Context, owner string) (StorageReport, error) {
	r := StorageReport{VMs: []VMStorage{}}
	store, err := m.snaps.memStore()
	if err != nil {
		return r, fmt.Errorf("storage usage: %w", err)
	}
	roots, err := m.gc.roots()
	if err != nil {
		return r, fmt.Errorf("storage usage: %w", err)
	}
	paths, err := memstore.FindAllManifests(roots...)
	if err != nil {
		return r, fmt.Errorf("storage usage: %w", err)
	}
	byVM, byCP := map[string][]string{}, map[string][]string{}
	for _, p := range paths {
		vm, cp := snapshotOwner(roots[0], p)
		byVM[vm] = append(byVM[vm], p)
		if cp != "" {
			byCP[vm+"@"+cp] = append(byCP[vm+"@"+cp], p)
		} else {
			byCP[vm+"@"] = append(byCP[vm+"@"], p) // its slot, or its base
		}
	}
	u, err := store.Usage(ctx, byVM)
	if err != nil {
		return r, fmt.Errorf("storage usage: %w", err)
	}
	r.Stored, r.Live, r.Garbage, r.Packs, r.Bases = u.Stored, u.Live, u.Garbage, u.Packs, u.Groups[""]
	perCP, err := store.Usage(ctx, byCP)
	if err != nil {
		return r, fmt.Errorf("storage usage: %w", err)
	}
	vms, err := m.db.ListVMs(ctx, owner)
	if err != nil {
		return r, err
	}
	disks, err := m.gc.diskUsage(ctx)
	if err != nil {
		return r, fmt.Errorf("storage usage: %w", err)
	}
	r.Disk = disks.total
	for _, vm := range vms {
		s := VMStorage{Name: vm.Name, Usage: u.Groups[vm.Name], Disk: disks.vms[vm.Name]}
		for key, cu := range perCP.Groups {
			if id, ok := strings.CutPrefix(key, vm.Name+"@"); ok && id != "" {
				s.Checkpoints = append(s.Checkpoints, CheckpointStorage{ID: id, Referenced: cu.Referenced, Frees: cu.Unique, DiskFrees: disks.checkpoints[key]})
			}
		}
		sort.Slice(s.Checkpoints, func(i, j int) bool { return cpOrder(s.Checkpoints[i].ID) < cpOrder(s.Checkpoints[j].ID) })
		r.VMs = append(r.VMs, s)
	}
	return r, nil
}

// snapshotOwner is the VM (and the checkpoint, if any) whose snapshot the
// manifest at path is, under vms (the host path of the VMs' directory);
// "" for a warm base's.
func snapshotOwner(vms, path string) (vm, cp string) {
	rel, err := filepath.Rel(vms, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", ""
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	vm = parts[0]
	if len(parts) > 3 && parts[1] == "checkpoints" {
		cp = parts[2]
	}
	return vm, cp
}

// cpOrder orders checkpoint ids (cp-N) by N.
func cpOrder(id string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "cp-"))
	return n
}

// diskData is what the volume's disk files hold: in total, per VM, and
// what only each checkpoint's disk holds ("vm@id").
type diskData struct {
	total       int64
	vms         map[string]memstore.Usage
	checkpoints map[string]int64
}

// diskUsage reads which data slices every disk file on the volume
// references (through the read-only mount: JuiceFS would compact a
// clone's chunks where the read-write one looks): a slice one file alone
// references is what removing that file frees.
func (c *collector) diskUsage(ctx context.Context) (diskData, error) {
	d := diskData{vms: map[string]memstore.Usage{}, checkpoints: map[string]int64{}}
	type ref struct {
		vm, cp string
		bytes  int64
	}
	refs := map[uint64][]ref{}
	for _, top := range []storage.Path{storage.VMsDir(), storage.ImagesDir(), sparesDir} {
		root, err := c.m.vol.ReadPath(top)
		if err != nil {
			return d, err
		}
		err = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // gone meanwhile
				}
				return err
			}
			if e.IsDir() || !isDiskFile(top, e.Name()) {
				return nil
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			slices, err := c.m.vol.SliceBytes(ctx, top.Join(strings.Split(filepath.ToSlash(rel), "/")...))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			vm, cp := "", ""
			if top == storage.VMsDir() {
				vm, cp = snapshotOwner(root, p)
			}
			for id, n := range slices {
				refs[id] = append(refs[id], ref{vm, cp, n})
			}
			return nil
		})
		if err != nil {
			return d, err
		}
	}
	for _, rs := range refs {
		d.total += rs[0].bytes
		vms := map[string]bool{}
		for _, r := range rs {
			vms[r.vm] = true
		}
		for vm := range vms {
			if vm == "" {
				continue
			}
			u := d.vms[vm]
			u.Referenced += rs[0].bytes
			if len(vms) == 1 {
				u.Unique += rs[0].bytes
			} else {
				u.Shared += rs[0].bytes
			}
			d.vms[vm] = u
		}
		if len(rs) == 1 && rs[0].cp != "" {
			d.checkpoints[rs[0].vm+"@"+rs[0].cp] += rs[0].bytes
		}
	}
	return d, nil
}

// isDiskFile says whether a file named name under the volume directory
// top is a disk image: a VM's or checkpoint's disk, an image's, a spare.
func isDiskFile(top storage.Path, name string) bool {
	return top == sparesDir || name == "disk" || strings.HasPrefix(name, "disk-")
}
