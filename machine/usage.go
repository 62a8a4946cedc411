package machine

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// usageCache remembers each VM's last measured disk use, and the
// generation of the VM's record it was measured at, and shares the
// figures through the registry (registry.UsageStore): every host of a
// cluster lists what any of them measured, and a restart keeps them.
// Measuring asks the volume (tens of milliseconds under load), which the
// answer to a wake or a sleep should not wait for, nor a listing pay for
// each of a thousand sleeping VMs. A VM that is not running changes its
// disk only through an operation, and every operation writes its record:
// the figure measured at the record's generation holds until the record
// changes. An operation that leaves its VM not running has its disk
// measured in the background (soon), so that the next listing, on any
// host, finds the figure.
type usageCache struct {
	db  registry.UsageStore
	vol storage.Volume
	log *slog.Logger
	// background runs the measures soon asks for (Manager.inBackground).
	background func(func(context.Context)) bool

	mu sync.Mutex
	by map[string]registry.DiskUsage
	// queued are the VMs soon asked to measure, the latest record of
	// each; measuring says a worker is at them.
	queued    map[string]registry.VM
	measuring bool
	// flights are the measures listings started (fill), by VM.
	flights map[string]*flight
}

// usageWorkers bounds the measures a listing runs at once.
const usageWorkers = 8

// usageBatch is how many figures the warm-up measures before it shares
// them.
const usageBatch = 32

// fresh is the figure of vm when it still holds: measured at its record's
// generation, and the VM is not running.
func (c *usageCache) fresh(vm registry.VM) (int64, bool) {
	if vm.State == registry.StateRunning {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.by[vm.Name]
	return u.Data, ok && u.Holds(vm)
}

// last is the last figure measured of the VM (0 when never measured).
func (c *usageCache) last(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by[name].Data
}

// pull takes the figures the registry has that are newer than this
// host's.
func (c *usageCache) pull(ctx context.Context) {
	us, err := c.db.DiskUsages(ctx)
	if err != nil {
		c.log.Debug("den: read the disks' measured use", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = make(map[string]registry.DiskUsage, len(us))
	}
	for name, u := range us {
		if have, ok := c.by[name]; !ok || !have.Created.Equal(u.Created) || have.Generation < u.Generation {
			c.by[name] = u
		}
	}
}

// measure asks the volume what vm's disk holds, and keeps the figure.
func (c *usageCache) measure(ctx context.Context, vm registry.VM) (registry.DiskUsage, error) {
	u, err := c.vol.Usage(ctx, storage.VMDisk(vm.Name))
	if err != nil {
		return registry.DiskUsage{}, err
	}
	fig := registry.DiskUsage{VM: vm.Name, Created: vm.CreatedAt, Generation: vm.Generation, Data: u.Data}
	c.mu.Lock()
	if c.by == nil {
		c.by = map[string]registry.DiskUsage{}
	}
	if have, ok := c.by[vm.Name]; !ok || !have.Created.Equal(fig.Created) || have.Generation <= fig.Generation {
		c.by[vm.Name] = fig // not over a figure of a newer record
	}
	c.mu.Unlock()
	return fig, nil
}

// share records figures in the registry for the other hosts, and the
// next start.
func (c *usageCache) share(ctx context.Context, figs []registry.DiskUsage) {
	if err := c.db.SetDiskUsage(ctx, figs); err != nil {
		c.log.Debug("den: record the disks' measured use", "err", err)
	}
}

// shareLast is share for a background job's last figures: shared even
// when ctx ended (the Manager closing), within 10 s.
func (c *usageCache) shareLast(ctx context.Context, figs []registry.DiskUsage) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	c.share(sctx, figs)
}

// used is the data vm's disk holds: the figure that still holds (fresh)
// when measure says so, else measured now (and shared); the last figure
// when measure is false.
func (c *usageCache) used(ctx context.Context, vm registry.VM, measure bool) int64 {
	if !measure {
		return c.last(vm.Name)
	}
	if data, ok := c.fresh(vm); ok {
		return data
	}
	fig, err := c.measure(ctx, vm)
	if err != nil {
		return 0
	}
	if vm.State != registry.StateRunning {
		c.share(ctx, []registry.DiskUsage{fig})
	}
	return fig.Data
}

// listWait bounds how long a listing waits for the disks it measures:
// past it, a VM lists its last figure, marked as being measured
// (Status.DiskMeasuring), and the measure goes on in the background and
// is shared, for the next listing on any host.
const listWait = 2 * time.Second

// flight is a measure under way of one VM's disk, at one record of it:
// listings that want that figure meanwhile wait for it instead of
// measuring again.
type flight struct {
	vm   registry.VM
	done chan struct{} // closed once fig's Data and ok are set
	fig  registry.DiskUsage
	ok   bool
}

// at says f (which may be nil) measures vm at its record.
func (f *flight) at(vm registry.VM) bool { return f != nil && f.fig.Holds(vm) }

// fill sets each status's DiskUsed: the figures that hold, this host's or
// another's (pulled from the registry once, when this host lacks some),
// and measures (usageWorkers at a time, in the background) the others,
// which it shares. It waits at most listWait for the measures.
func (c *usageCache) fill(ctx context.Context, sts []Status) {
	stale := func() []int {
		var todo []int
		for i := range sts {
			if data, ok := c.fresh(sts[i].VM); ok {
				sts[i].DiskUsed = data
			} else {
				todo = append(todo, i)
			}
		}
		return todo
	}
	todo := stale()
	if len(todo) == 0 {
		return
	}
	// A running VM's figure is measured each time: only those of VMs
	// that are not are worth a read of the registry's.
	if slices.ContainsFunc(todo, func(i int) bool { return sts[i].VM.State != registry.StateRunning }) {
		c.pull(ctx)
		todo = stale()
	}
	fls := c.fly(ctx, todo, sts)
	wait := time.NewTimer(listWait)
	defer wait.Stop()
waiting:
	for _, f := range fls {
		select {
		case <-f.done:
		case <-wait.C:
			break waiting
		case <-ctx.Done():
			break waiting
		}
	}
	for k, i := range todo {
		select {
		case <-fls[k].done:
			if fls[k].ok {
				sts[i].DiskUsed = fls[k].fig.Data
				continue
			}
		default:
			sts[i].DiskMeasuring = true
		}
		sts[i].DiskUsed = c.last(sts[i].VM.Name)
	}
}

// fly returns the flights of the VMs of sts at indexes todo: those under
// way at the same record, and new ones it starts in the background (or
// runs under ctx, when the Manager is closing).
func (c *usageCache) fly(ctx context.Context, todo []int, sts []Status) []*flight {
	fls := make([]*flight, len(todo))
	// Running VMs first: the sleeping ones' figures hold once measured,
	// theirs are measured at each listing.
	var running, rest []*flight
	c.mu.Lock()
	if c.flights == nil {
		c.flights = map[string]*flight{}
	}
	for k, i := range todo {
		vm := sts[i].VM
		f := c.flights[vm.Name]
		if !f.at(vm) {
			f = &flight{vm: vm, done: make(chan struct{}),
				fig: registry.DiskUsage{VM: vm.Name, Created: vm.CreatedAt, Generation: vm.Generation}}
			c.flights[vm.Name] = f
			if vm.State == registry.StateRunning {
				running = append(running, f)
			} else {
				rest = append(rest, f)
			}
		}
		fls[k] = f
	}
	c.mu.Unlock()
	start := append(running, rest...)
	if len(start) > 0 && !c.background(func(ctx context.Context) { c.measureAll(ctx, start) }) {
		c.measureAll(ctx, start)
	}
	return fls
}

// flying says a listing's measure of vm's disk, at its record, is under
// way.
func (c *usageCache) flying(vm registry.VM) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flights[vm.Name].at(vm)
}

// measureAll measures the flights' disks, usageWorkers at a time, and
// shares the figures of VMs that are not running, usageBatch at a time.
func (c *usageCache) measureAll(ctx context.Context, fls []*flight) {
	var mu sync.Mutex
	var figs []registry.DiskUsage
	inParallel(fls, usageWorkers, func(f *flight) {
		measured := false
		if data, ok := c.fresh(f.vm); ok { // measured meanwhile (soon), and shared
			f.fig.Data, f.ok = data, true
		} else if ctx.Err() == nil {
			fig, err := c.measure(ctx, f.vm)
			f.fig, f.ok, measured = fig, err == nil, err == nil
		}
		c.mu.Lock()
		if c.flights[f.vm.Name] == f {
			delete(c.flights, f.vm.Name)
		}
		c.mu.Unlock()
		close(f.done)
		if !measured || f.vm.State == registry.StateRunning {
			return
		}
		mu.Lock()
		figs = append(figs, f.fig)
		var batch []registry.DiskUsage
		if len(figs) == usageBatch {
			batch, figs = figs, nil
		}
		mu.Unlock()
		if batch != nil {
			c.share(ctx, batch)
		}
	})
	c.shareLast(ctx, figs)
}

// warm takes the figures the registry has, then measures, one at a time,
// the disks of db's VMs that are not running and whose figure no longer
// holds, and shares them usageBatch at a time: the first listing after a
// start finds their figures (a host with a thousand sleeping VMs lists
// them at once).
func (c *usageCache) warm(ctx context.Context, db registry.VMStore) {
	c.pull(ctx)
	vms, err := db.ListVMs(ctx, "")
	if err != nil {
		return
	}
	var figs []registry.DiskUsage
	for _, vm := range vms {
		if ctx.Err() != nil {
			break
		}
		if _, ok := c.fresh(vm); ok || vm.State == registry.StateRunning || c.flying(vm) {
			continue
		}
		if fig, err := c.measure(ctx, vm); err == nil {
			figs = append(figs, fig)
		}
		if len(figs) == usageBatch {
			c.share(ctx, figs)
			figs = nil
		}
	}
	c.shareLast(ctx, figs)
}

// soon measures vm's disk in the background and shares the figure: an
// operation left the VM not running, with the record vm.
func (c *usageCache) soon(vm registry.VM) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.queued == nil {
		c.queued = map[string]registry.VM{}
	}
	c.queued[vm.Name] = vm
	if c.measuring {
		return
	}
	c.measuring = c.background(c.measureQueued)
}

// measureQueued measures what soon queued, one VM at a time, until none
// is left.
func (c *usageCache) measureQueued(ctx context.Context) {
	for {
		c.mu.Lock()
		var vm registry.VM
		found := false
		for name, v := range c.queued {
			vm, found = v, true
			delete(c.queued, name)
			break
		}
		if !found || ctx.Err() != nil {
			c.measuring = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if _, ok := c.fresh(vm); ok {
			continue
		}
		if fig, err := c.measure(ctx, vm); err == nil {
			c.share(ctx, []registry.DiskUsage{fig})
		}
	}
}

// forget drops a removed VM's figure (the registry's goes with its
// record).
func (c *usageCache) forget(name string) {
	c.mu.Lock()
	delete(c.by, name)
	delete(c.queued, name)
	c.mu.Unlock()
}
