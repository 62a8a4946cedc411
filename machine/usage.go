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

// diskUsed is the data the VM's disk holds: measured now when measure
// says so (and remembered), else the last figure (0 when never measured).
func (m *Manager) diskUsed(ctx context.Context, name string, measure bool) int64 {
	c := &m.usage
	if !measure {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.by[name]
	}
	u, err := m.vol.Usage(ctx, storage.VMDisk(name))
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

// forgetUsage drops a removed VM's figure.
func (m *Manager) forgetUsage(name string) {
	m.usage.mu.Lock()
	delete(m.usage.by, name)
	m.usage.mu.Unlock()
}
