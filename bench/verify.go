package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/poll"
)

// verifyThroughput times `den checkpoint verify` of a fresh checkpoint of
// the VM, every extent of every file checked, once its digests are
// written: MB/s of checkpoint files (memory, disk, device state) checked.
// The data is read; the holes the volume maps are checked without a read.
func (d *daemon) verifyThroughput(ctx context.Context, o Options, accel, label, name string) (Figure, error) {
	f := Figure{Name: "checkpoint verify (every extent checked)", VMM: d.vmm, Accel: accel, Memory: label, Unit: "MB/s",
		Note: "memory and disk of the checkpoint, through the volume: the data read, the holes by the volume's map"}
	cp, err := d.client.Checkpoint(ctx, name, api.CheckpointRequest{Comment: "bench: verify"}, nil)
	if err != nil {
		return f, err
	}
	req := api.VerifyRequest{Checkpoint: cp.ID}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		res, err := d.client.VerifyCheckpoints(ctx, name, req, nil)
		if err != nil {
			return f, err
		}
		if len(res) == 1 && res[0].Status == "ok" {
			break
		}
		if len(res) == 1 && res[0].Status == "damaged" {
			return f, fmt.Errorf("verify %s: %s", cp.ID, res[0].Error)
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("verify %s: its digests were not written in 10 minutes", cp.ID)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i := 0; i < o.Runs; i++ {
		var bytes int64
		t, err := timed(func() error {
			res, err := d.client.VerifyCheckpoints(ctx, name, req, nil)
			for _, v := range res {
				for _, file := range v.Files {
					bytes += file.Size
				}
			}
			return err
		})
		if err != nil {
			return f, err
		}
		f.Samples = append(f.Samples, float64(bytes)/1e6/t.Seconds())
	}
	f.Median, f.Min, f.Max = stats(f.Samples)
	_ = d.client.DeleteCheckpoint(ctx, name, cp.ID)
	return f, nil
}

// sealedWake puts the VM to sleep, waits until the digests of its
// suspend slot's memory are written (in the background, after the sleep),
// and times the wake, which then verifies the memory it restores.
func (d *daemon) sealedWake(ctx context.Context, name string) (time.Duration, error) {
	if _, err := d.client.Sleep(ctx, name, api.SleepRequest{}); err != nil {
		return 0, err
	}
	slot := filepath.Join(d.dir, "state", "juicefs", "mnt", "vms", name, "suspend")
	if !poll.Until(5*time.Minute, func() bool { return checkpoint.Sealed(slot) }) {
		return 0, fmt.Errorf("the suspend slot of %s has no digests after 5 minutes", name)
	}
	return timed(func() error { _, err := d.client.Wake(ctx, name); return err })
}
