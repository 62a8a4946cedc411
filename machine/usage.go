package machine

import (
	"context"
	"sync"

	"github.com/denhq/den/storage"
)

// usageCache remembers each VM's last measured disk use. Measuring runs
// a juicefs process (tens of milliseconds under load), which the answer
// to a wake or a sleep should not wait for.
type usageCache struct {
	mu sync.Mutex
	by map[string]int64
}

// used is the data the VM's disk on vol holds: measured now when measure
// says so (and remembered), else the last figure (0 when never measured).
func (c *usageCache) used(ctx context.Context, vol storage.Volume, name string, measure bool) int64 {
	if !measure {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.by[name]
	}
	u, err := vol.Usage(ctx, storage.VMDisk(name))
	if err != nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]int64{}
	}
	c.by[name] = u.Data
	return u.Data
}

// forget drops a removed VM's figure.
func (c *usageCache) forget(name string) {
	c.mu.Lock()
	delete(c.by, name)
	c.mu.Unlock()
}
