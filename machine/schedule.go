package machine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/denhq/den/registry"
)

// Schedule is a VM's checkpoint schedule: a checkpoint every Every
// while the VM runs (a sleeping or stopped VM has not changed: none is
// taken), of which the newest Keep are kept, and the newest of each of
// the last KeepDaily days. What the retention drops is deleted like any
// checkpoint, and its memory collected (collect.go). Checkpoints taken by
// hand are never the schedule's to delete.
type Schedule struct {
	Every     time.Duration `json:"every"`
	Keep      int           `json:"keep"`
	KeepDaily int           `json:"keep_daily,omitempty"`
	DiskOnly  bool          `json:"disk_only,omitempty"`
	// Taken are the checkpoints the schedule took and keeps, oldest
	// first; Last is when it last took one (or tried to).
	Taken []Scheduled `json:"taken,omitempty"`
	Last  time.Time   `json:"last,omitzero"`
}

// Scheduled is a checkpoint a schedule took.
type Scheduled struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
}

// MinScheduleEvery is the shortest interval a schedule takes.
const MinScheduleEvery = time.Second

// scheduleTick is how often the schedules are looked at.
const scheduleTick = time.Second

// SetSchedule sets (s not nil) or removes the VM's checkpoint schedule
// and returns it. A new schedule keeps what the old one took.
func (m *Manager) SetSchedule(ctx context.Context, name string, s *Schedule) (*Schedule, error) {
	if s != nil {
		if s.Every < MinScheduleEvery {
			return nil, fmt.Errorf("schedule of vm %q: every %v is under %v: %w", name, s.Every, MinScheduleEvery, ErrInvalid)
		}
		if s.Keep < 0 || s.KeepDaily < 0 || s.Keep+s.KeepDaily == 0 || s.Keep > 10000 || s.KeepDaily > 10000 {
			return nil, fmt.Errorf("schedule of vm %q: keep %d and keep-daily %d: at least one checkpoint, at most 10000 each: %w", name, s.Keep, s.KeepDaily, ErrInvalid)
		}
	}
	sp, err := m.updateSpec(ctx, name, "schedule", func(sp *spec) error {
		if s == nil {
			sp.Schedule = nil
			return nil
		}
		next := *s
		next.Taken, next.Last = nil, time.Now().UTC()
		if sp.Schedule != nil {
			next.Taken = sp.Schedule.Taken
		}
		sp.Schedule = &next
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("schedule of vm %q: %w", name, err)
	}
	return sp.Schedule, nil
}

// GetSchedule is the VM's checkpoint schedule, nil for none.
func (m *Manager) GetSchedule(ctx context.Context, name string) (*Schedule, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	sp, err := decodeSpec(vm)
	if err != nil {
		return nil, err
	}
	return sp.Schedule, nil
}

// schedules takes the VMs' scheduled checkpoints in the background.
type schedules struct {
	m    *Manager
	mu   sync.Mutex
	busy map[string]bool // VMs whose scheduled checkpoint is under way
}

// start looks at the schedules every scheduleTick until the Manager
// closes.
func (sc *schedules) start() {
	sc.m.inBackground(func(ctx context.Context) {
		every(ctx, scheduleTick, nil, 0, sc.look)
	})
}

// look takes, in the background, the checkpoints that are due.
func (sc *schedules) look(ctx context.Context) {
	if sc.m.hostDown.Load() {
		return
	}
	vms, err := sc.m.db.ListVMs(ctx, "")
	if err != nil {
		return
	}
	for _, vm := range vms {
		if sc.m.cfg.Leases != nil && sc.m.procs.instance(vm.Name) == nil {
			continue // another host of the cluster runs it
		}
		if sp, err := decodeSpec(vm); err == nil && due(vm, sp.Schedule, time.Now()) {
			sc.run(vm.Name)
		}
	}
}

// due says whether vm's schedule wants a checkpoint at now: it runs, and
// the interval has passed since the last.
func due(vm registry.VM, s *Schedule, now time.Time) bool {
	return s != nil && vm.State == registry.StateRunning && now.Sub(s.Last) >= s.Every
}

// run takes name's scheduled checkpoint in the background, unless one
// is under way.
func (sc *schedules) run(name string) {
	sc.mu.Lock()
	if sc.busy == nil {
		sc.busy = map[string]bool{}
	}
	if sc.busy[name] {
		sc.mu.Unlock()
		return
	}
	sc.busy[name] = true
	sc.mu.Unlock()
	if !sc.m.goBackground(func() {
		defer func() {
			sc.mu.Lock()
			delete(sc.busy, name)
			sc.mu.Unlock()
		}()
		ctx, cancel := sc.m.lifetime()
		defer cancel()
		if err := sc.checkpoint(ctx, name); err != nil && ctx.Err() == nil {
			sc.m.log.Warn("den: scheduled checkpoint", "vm", name, "err", err)
		}
	}) {
		sc.mu.Lock()
		delete(sc.busy, name)
		sc.mu.Unlock()
	}
}

// checkpoint takes the VM's scheduled checkpoint, if it is still due
// under the VM's lock, and applies the schedule's retention.
func (sc *schedules) checkpoint(ctx context.Context, name string) (err error) {
	m := sc.m
	o, err := m.begin(ctx, name, "scheduled checkpoint")
	if err != nil {
		return err
	}
	defer func() { o.end(err) }()
	s, now := o.spec.Schedule, time.Now().UTC()
	if !due(o.vm, s, now) {
		return nil
	}
	// What the schedule took and is still there (one deleted by hand
	// no longer counts).
	var taken []Scheduled
	for _, t := range s.Taken {
		if _, err := m.db.GetCheckpoint(ctx, name, t.ID); !errors.Is(err, registry.ErrNotFound) {
			taken = append(taken, t)
		}
	}
	cp, cerr := o.checkpoint(ctx, CheckpointOptions{Comment: "scheduled", DiskOnly: s.DiskOnly}, nil)
	if cerr == nil {
		taken = append(taken, Scheduled{ID: cp.ID, At: cp.CreatedAt})
	}
	keep, drop := retain(taken, s.Keep, s.KeepDaily)
	at := map[string]time.Time{}
	for _, t := range taken {
		at[t.ID] = t.At
	}
	for _, id := range drop {
		rec, gerr := m.db.GetCheckpoint(ctx, name, id)
		if errors.Is(gerr, registry.ErrNotFound) {
			continue // deleted meanwhile
		}
		switch {
		case gerr != nil:
		case id == o.spec.Restoring:
			gerr = fmt.Errorf("a restore to it is to be finished first")
		default:
			gerr = o.dropCheckpoint(ctx, rec)
		}
		if gerr != nil { // kept, and dropped at a later turn
			m.log.Warn("den: scheduled checkpoint retention", "vm", name, "checkpoint", id, "err", gerr)
			keep = append(keep, Scheduled{ID: id, At: at[id]})
		}
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].At.Before(keep[j].At) })
	if uerr := o.update(ctx, func(_ *registry.VM, sp *spec) error {
		if sp.Schedule != nil {
			sp.Schedule.Taken, sp.Schedule.Last = keep, now
		}
		return nil
	}); uerr != nil {
		return uerr
	}
	return cerr
}

// retain splits a schedule's checkpoints (oldest first) into those its
// retention keeps, oldest first (the newest keep, and the newest of each
// of the last daily days that have one), and the ids of the rest.
func retain(taken []Scheduled, keep, daily int) (kept []Scheduled, drop []string) {
	sorted := append([]Scheduled(nil), taken...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].At.Before(sorted[j].At) })
	days := map[string]bool{} // the days whose newest is kept
	for i := len(sorted) - 1; i >= 0; i-- {
		c := sorted[i]
		keepIt := len(sorted)-1-i < keep
		if day := c.At.UTC().Format(time.DateOnly); !days[day] && len(days) < daily {
			days[day], keepIt = true, true
		}
		if !keepIt {
			drop = append(drop, c.ID)
			continue
		}
		kept = append([]Scheduled{c}, kept...)
	}
	return kept, drop
}
