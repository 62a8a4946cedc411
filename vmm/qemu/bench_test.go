package qemu_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// reportMedian reports the median of ds in milliseconds (the figure den
// publishes; ns/op is the mean).
func reportMedian(b *testing.B, prefix string, ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(ds[len(ds)/2]), prefix+"median-ms")
	b.ReportMetric(ms(ds[0]), prefix+"min-ms")
	b.ReportMetric(ms(ds[len(ds)-1]), prefix+"max-ms")
}

// BenchmarkBootToAgentReady: QEMU start to the agent answering ready.
func BenchmarkBootToAgentReady(b *testing.B) {
	e := newGuestEnv(b)
	var ds []time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		v := e.newVMM(b, "boot"+time.Now().Format("150405.000000"))
		c := e.boot(b, v)
		ds = append(ds, time.Since(start))
		c.Close()
		v.Shutdown(context.Background())
	}
	reportMedian(b, "", ds)
}

// BenchmarkSnapshotRestore: pause+snapshot of a booted 256 MiB guest, and
// restore into a fresh QEMU to a running VM whose agent answers. Each
// round stops the source and continues from the restored VM (the disk
// can be open in one QEMU only), as sleep and wake do.
func BenchmarkSnapshotRestore(b *testing.B) {
	e := newGuestEnv(b)
	ctx := context.Background()
	v := e.newVMM(b, "src")
	c := e.boot(b, v)
	c.Close()
	var snaps, restores, ready []time.Duration
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(e.dir, "snap"+time.Now().Format("150405.000000"))
		os.Mkdir(dir, 0o700)
		start := time.Now()
		if err := v.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		if err := v.Snapshot(ctx, dir); err != nil {
			b.Fatal(err)
		}
		snaps = append(snaps, time.Since(start))
		if err := v.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
		w := e.newVMM(b, "dst"+time.Now().Format("150405.000000"))
		start = time.Now()
		if err := w.Restore(ctx, dir, vmm.RestoreOptions{Resume: true}); err != nil {
			b.Fatal(err)
		}
		restores = append(restores, time.Since(start))
		c := e.connect(b, w)
		ready = append(ready, time.Since(start))
		c.Close()
		v = w
		os.RemoveAll(dir)
	}
	reportMedian(b, "snapshot-", snaps)
	reportMedian(b, "restore-", restores)
	reportMedian(b, "ready-", ready)
}
