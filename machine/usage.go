package machine

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sync"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// usageCache remembers each VM's last measured disk use, and the
// generation of the VM's record it was measured at. Measuring asks the
// volume (tens of milliseconds under load), which the answer to a wake or
// a sleep should not wait for, nor a listing pay for each of a thousand
// sleeping VMs. A VM that is not running changes its disk only through an
// operation, and every operation writes its record: the figure measured
// at the record's generation holds until the record changes, across a
// restart too (the figures are kept in the state dir).
type usageCache struct {
	mu      sync.Mutex
	by      map[string]usageFigure
	changed bool // since the last save
}

type usageFigure struct {
	Gen  int64 `json:"gen"`
	Data int64 `json:"data"`
	// Created is the VM's creation (Unix ms): a VM made again under
	// the name starts its generations anew.
	Created int64 `json:"created"`
}

// load reads the figures a previous daemon saved in path; none when
// there are none or they cannot be read (they are measured again).
func (c *usageCache) load(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var by map[string]usageFigure
	if json.Unmarshal(data, &by) != nil {
		return
	}
	c.mu.Lock()
	c.by = by
	c.mu.Unlock()
}

// save writes the figures to path when they changed since the last save.
func (c *usageCache) save(path string) error {
	c.mu.Lock()
	if !c.changed {
		c.mu.Unlock()
		return nil
	}
	data, err := json.Marshal(c.by)
	c.changed = false
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}

// usageWorkers bounds the measures a listing runs at once.
const usageWorkers = 8

// fresh is the figure of vm when it still holds: measured at its record's
// generation, and the VM is not running.
func (c *usageCache) fresh(vm registry.VM) (int64, bool) {
	if vm.State == registry.StateRunning {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.by[vm.Name]
	return f.Data, ok && f.Gen == vm.Generation && f.Created == vm.CreatedAt.UnixMilli()
}

// last is the last figure measured of the VM (0 when never measured).
func (c *usageCache) last(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by[name].Data
}

// used is the data vm's disk on vol holds: the figure that still holds
// (fresh) when measure says so, else measured now (and remembered); the
// last figure when measure is false.
func (c *usageCache) used(ctx context.Context, vol storage.Volume, vm registry.VM, measure bool) int64 {
	if !measure {
		return c.last(vm.Name)
	}
	if data, ok := c.fresh(vm); ok {
		return data
	}
	u, err := vol.Usage(ctx, storage.VMDisk(vm.Name))
	if err != nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]usageFigure{}
	}
	c.by[vm.Name] = usageFigure{Gen: vm.Generation, Data: u.Data, Created: vm.CreatedAt.UnixMilli()}
	c.changed = true
	return u.Data
}

// fill sets each status's DiskUsed, measuring (usageWorkers at a time)
// only those whose figure no longer holds.
func (c *usageCache) fill(ctx context.Context, vol storage.Volume, sts []Status) {
	todo := make(chan int)
	var wg sync.WaitGroup
	for range min(usageWorkers, len(sts)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				sts[i].DiskUsed = c.used(ctx, vol, sts[i].VM, true)
			}
		}()
	}
	for i := range sts {
		if data, ok := c.fresh(sts[i].VM); ok {
			sts[i].DiskUsed = data
			continue
		}
		todo <- i
	}
	close(todo)
	wg.Wait()
}

// warm measures, one at a time, the disks of the VMs of db that are not
// running and whose figure no longer holds, so that the first listing
// after a start finds their figures (a host with a thousand sleeping VMs
// lists them at once), and saves them to path.
func (c *usageCache) warm(ctx context.Context, db registry.Store, vol storage.Volume, path string, log *slog.Logger) {
	defer c.saveTo(path, log)
	vms, err := db.ListVMs(ctx, "")
	if err != nil {
		return
	}
	for _, vm := range vms {
		if ctx.Err() != nil {
			return
		}
		if vm.State != registry.StateRunning {
			c.used(ctx, vol, vm, true)
		}
	}
}

// saveTo keeps the figures in path for the next start.
func (c *usageCache) saveTo(path string, log *slog.Logger) {
	if err := c.save(path); err != nil {
		log.Warn("den: save the disks' measured use", "err", err)
	}
}

// forget drops a removed VM's figure.
func (c *usageCache) forget(name string) {
	c.mu.Lock()
	delete(c.by, name)
	c.changed = true
	c.mu.Unlock()
}
