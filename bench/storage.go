package bench

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/denhq/den/api"
)

// checkpointsStored is how many checkpoints each storage figure takes.
const checkpointsStored = 20

// storageFigures measures what memory checkpoints store: how much the
// embedded volume's object store grows per checkpoint of an idle VM
// (512 MiB; and 2 GiB unless quick) and of a 512 MiB VM that writes 10%
// of its RAM anew between two checkpoints, each over checkpointsStored
// checkpoints; and, unless only is set (a comparison variant: the idle
// 512 MiB figure alone), the memory store's collection of what half of
// them held.
func (d *daemon) storageFigures(ctx context.Context, o Options, accel string, only bool, say func(string)) ([]Figure, error) {
	type series struct {
		label, mem string
		bytes      int64
		dirty      string // run in the guest before each checkpoint
		name       string
	}
	all := []series{{"idle", "512M", 512 << 20, "", "object storage per memory checkpoint (idle)"}}
	if !only {
		if !o.Quick {
			all = append(all, series{"idle", "2G", 2 << 30, "", "object storage per memory checkpoint (idle)"})
		}
		all = append(all, series{"10% dirty", "512M", 512 << 20, "head -c 53687091 /dev/urandom > /dev/shm/dirty",
			"object storage per memory checkpoint (10% of RAM new)"})
	}
	var figs []Figure
	for i, s := range all {
		name := fmt.Sprintf("s%d", i)
		if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, MemoryBytes: s.bytes, IdleTimeout: "0"}, nil); err != nil {
			return figs, err
		}
		if _, err := d.client.Checkpoint(ctx, name, api.CheckpointRequest{}, nil); err != nil { // the first after the create
			return figs, err
		}
		var mibs []float64
		for k := 0; k < checkpointsStored; k++ {
			say(fmt.Sprintf("storage, %s %s: checkpoint %d/%d", s.mem, s.label, k+1, checkpointsStored))
			if s.dirty != "" {
				if _, err := d.exec(ctx, name, s.dirty); err != nil {
					return figs, err
				}
			}
			before := d.objectBytes()
			if _, err := d.client.Checkpoint(ctx, name, api.CheckpointRequest{}, nil); err != nil {
				return figs, err
			}
			mibs = append(mibs, float64(d.objectBytes()-before)/(1<<20))
		}
		f := Figure{Name: s.name, VMM: d.vmm, Accel: accel, Memory: s.mem, Unit: "MiB", Samples: mibs,
			Note: fmt.Sprintf("the embedded volume's objects, after each of %d checkpoints", checkpointsStored)}
		f.Median, f.Min, f.Max = stats(mibs)
		figs = append(figs, f)
		if !only && i == 0 {
			g, err := d.collectFigure(ctx, accel, name, say)
			if err != nil {
				return figs, err
			}
			figs = append(figs, g)
		}
		_ = d.client.RemoveVM(ctx, name, true)
	}
	return figs, nil
}

// collectFigure deletes every other checkpoint of vm and times den gc:
// the bytes it freed (packs removed, dead extents moved out) over its
// time.
func (d *daemon) collectFigure(ctx context.Context, accel, vm string, say func(string)) (Figure, error) {
	say("storage: the collection of every other checkpoint's memory")
	cps, err := d.client.Checkpoints(ctx, vm)
	if err != nil {
		return Figure{}, err
	}
	for i, cp := range cps {
		if i%2 == 0 {
			if err := d.client.DeleteCheckpoint(ctx, vm, cp.ID); err != nil {
				return Figure{}, err
			}
		}
	}
	start := time.Now()
	got, err := d.client.CollectGarbage(ctx, api.GCRequest{})
	took := time.Since(start)
	if err != nil {
		return Figure{}, err
	}
	freed := float64(got.Bytes+got.Freed) / (1 << 20)
	rate := freed / took.Seconds()
	return Figure{Name: "memory store collection", VMM: d.vmm, Accel: accel, Memory: "512M", Unit: "MiB/s",
		Samples: []float64{rate}, Median: rate, Min: rate, Max: rate,
		Note: fmt.Sprintf("%.1f MiB freed (%d packs removed, %.1f MiB moved) in %s", freed, got.Removed, float64(got.Moved)/(1<<20), took.Round(time.Millisecond))}, nil
}

// objectBytes is what the embedded volume's object store holds.
func (d *daemon) objectBytes() int64 {
	var n int64
	_ = filepath.WalkDir(filepath.Join(d.dir, "state", "juicefs", "objects"), func(_ string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if info, err := e.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
