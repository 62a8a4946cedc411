package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/denhq/den/api"
)

// buildStep is the work timed with the activity record on and off: a
// build's shape at its most costly for the record (every step a new
// process writing a file under /root), 150 steps of sh and cat.
const buildStep = `mkdir -p /root/bench && i=0; while [ $i -lt 150 ]; do i=$((i+1)); sh -c "echo $i | cat > /root/bench/f$((i%16))"; done`

// Names of the activity figures.
const (
	activityOn  = "build step, activity record on (150 processes writing files)"
	activityOff = "build step, activity record off (150 processes writing files)"
)

// activityCost times buildStep in one VM with the guest's activity
// record on and off in turn, run after run, each first in every other
// run (this host's speed drifts over minutes).
func (d *daemon) activityCost(ctx context.Context, o Options, accel string, say func(string)) ([]Figure, error) {
	const name = "activity"
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, IdleTimeout: "0"}, nil); err != nil {
		return nil, err
	}
	defer d.client.RemoveVM(context.WithoutCancel(ctx), name, true)
	if _, err := d.exec(ctx, name, buildStep); err != nil { // warm-up: the programs in the page cache
		return nil, fmt.Errorf("build step: %w", err)
	}
	var on, off []time.Duration
	for i := 0; i < o.Runs; i++ {
		say(fmt.Sprintf("build step with the activity record on and off (%d/%d)", i+1, o.Runs))
		for j, rec := range []bool{i%2 == 0, i%2 != 0} {
			if _, err := d.client.SetActivityRecord(ctx, name, rec); err != nil {
				return nil, err
			}
			t, err := timed(func() error { _, err := d.exec(ctx, name, buildStep); return err })
			if err != nil {
				return nil, fmt.Errorf("build step (record %v, %d): %w", rec, j, err)
			}
			if rec {
				on = append(on, t)
			} else {
				off = append(off, t)
			}
		}
	}
	_, _ = d.client.SetActivityRecord(ctx, name, true)
	return []Figure{figure(activityOn, d.vmm, accel, "512M", on), figure(activityOff, d.vmm, accel, "512M", off)}, nil
}
