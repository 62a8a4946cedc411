package storage

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/denhq/den/internal/pgtest"
	"golang.org/x/sys/unix"
)

// TestBenchStorage measures the volume through its FUSE mount, for each
// shape: clone time against file size, sequential and 4 KiB random I/O.
// It runs only with DEN_BENCH=1 (scripts/bench-storage.sh) and prints the
// median of DEN_BENCH_RUNS runs (default 5) of each figure.
func TestBenchStorage(t *testing.T) {
	if os.Getenv("DEN_BENCH") == "" {
		t.Skip("benchmark: run scripts/bench-storage.sh (DEN_BENCH=1)")
	}
	needIntegration(t)
	runs := 5
	if n, err := strconv.Atoi(os.Getenv("DEN_BENCH_RUNS")); err == nil && n > 0 {
		runs = n
	}
	sizes := []int64{1 << 30, 4 << 30, 16 << 30}
	shapes := strings.Fields(os.Getenv("DEN_BENCH_SHAPES"))
	if len(shapes) == 0 {
		shapes = []string{"embedded", "minio", "minio-writeback", "minio-postgres"}
	}
	var m *minioServer
	var rows [][]string
	for _, shape := range shapes {
		cfg := Config{StateDir: t.TempDir()}
		if shape != "embedded" {
			if m == nil {
				m = startMinIO(t)
			}
			cfg.S3 = &S3Config{Endpoint: m.Endpoint(), Bucket: "bench-" + shape, CreateBucket: true}
			cfg.Secrets = Secrets{AccessKey: m.user, SecretKey: m.password}
			cfg.Writeback = shape == "minio-writeback"
			if shape == "minio-postgres" {
				pg := pgtest.Start(t)
				cfg.MetaURL = pg.URL
				cfg.Secrets.MetaPassword = pgtest.Password
			}
		}
		v := openVolume(t, cfg)
		ctx := context.Background()
		row := func(what string, unit string, f func(i int) float64) {
			var xs []float64
			for i := range runs {
				xs = append(xs, f(i))
			}
			slices.Sort(xs)
			med := xs[len(xs)/2]
			rows = append(rows, []string{shape, what, fmt.Sprintf("%.1f %s", med, unit),
				fmt.Sprintf("%.1f..%.1f", xs[0], xs[len(xs)-1])})
			t.Logf("%-16s %-34s %10.1f %s", shape, what, med, unit)
		}

		// Clone against logical size: 64 MiB of data in each file.
		for _, size := range sizes {
			src := VMDisk(fmt.Sprintf("c%d", size>>30))
			if err := v.CreateDisk(ctx, src, size); err != nil {
				t.Fatal(err)
			}
			p, _ := v.Path(src)
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			buf := pattern(4*mib, 7)
			for i := range int64(16) {
				if _, err := f.WriteAt(buf, i*(size/16)); err != nil {
					t.Fatal(err)
				}
			}
			f.Sync()
			f.Close()
			row(fmt.Sprintf("clone %2d GiB (64 MiB data)", size>>30), "ms", func(i int) float64 {
				start := time.Now()
				if err := v.Clone(ctx, src, CheckpointFile(src.Dir().Base(), strconv.Itoa(i), "disk")); err != nil {
					t.Fatal(err)
				}
				return ms(time.Since(start))
			})
		}

		// Sequential: 256 MiB in 1 MiB writes, fsync at the end; read back
		// with O_DIRECT after a remount with an empty cache (cold) and again
		// (warm: juicefs's local cache).
		const seqSize = 256 * mib
		seqFile := func(i int) string { p, _ := v.Path(VMDisk(fmt.Sprintf("seq%d", i))); return p }
		row("seq write 1M, fsync at end", "MB/s", func(i int) float64 {
			if err := v.CreateDisk(ctx, VMDisk(fmt.Sprintf("seq%d", i)), 0); err != nil {
				t.Fatal(err)
			}
			buf := pattern(mib, byte(i))
			f, _ := os.OpenFile(seqFile(i), os.O_WRONLY, 0)
			start := time.Now()
			for off := int64(0); off < seqSize; off += mib {
				if _, err := f.WriteAt(buf, off); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			return mbps(seqSize, time.Since(start))
		})
		// With writeback, acknowledged blocks may still be only in the
		// local cache, waiting for upload: that cache is the data, and
		// throwing it away loses writes (the reason den leaves writeback
		// off). The writeback shape is remounted on the same cache, so
		// its "cold" read is one after a remount, not from the store.
		if cfg.Writeback {
			waitStagingEmpty(t, cfg.CacheDir)
		}
		uctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := v.Unmount(uctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if !cfg.Writeback {
			cfg.CacheDir = t.TempDir()
		}
		v = openVolume(t, cfg)
		row("seq read 1M O_DIRECT, cold", "MB/s", func(i int) float64 { return seqRead(t, seqFile(i), seqSize) })
		row("seq read 1M O_DIRECT, warm", "MB/s", func(i int) float64 { return seqRead(t, seqFile(i), seqSize) })

		// 4 KiB random I/O in a 1 GiB disk.
		const randSize = 1 << 30
		if err := v.CreateDisk(ctx, VMDisk("rand"), randSize); err != nil {
			t.Fatal(err)
		}
		rp, _ := v.Path(VMDisk("rand"))
		row("rand write 4k, fsync each (200)", "IOPS", func(i int) float64 { return randWrite(t, rp, randSize, 200, true, i) })
		row("rand write 4k, fsync at end (2000)", "IOPS", func(i int) float64 { return randWrite(t, rp, randSize, 2000, false, i) })
		row("rand read 4k O_DIRECT (2000)", "IOPS", func(i int) float64 { return randRead(t, seqFile(0), seqSize, 2000, i) })
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| shape | measure | median of %d | range |\n|---|---|---|---|\n", runs)
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Print(b.String())
	if out := os.Getenv("DEN_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// waitStagingEmpty waits (bounded) until no block waits for upload in a
// juicefs cache dir (<cache>/<uuid>/rawstaging).
func waitStagingEmpty(t *testing.T, cacheDir string) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		staged := 0
		_ = filepath.WalkDir(cacheDir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.Contains(p, "/rawstaging/") {
				staged++
			}
			return nil
		})
		if staged == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d blocks still staged for upload after 2 minutes", staged)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func mbps(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

func openDirect(t *testing.T, path string) *os.File {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatalf("open O_DIRECT: %v", err)
	}
	return f
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptrOf(b)%4096)
	return b[off : off+n]
}

func seqRead(t *testing.T, path string, size int64) float64 {
	f := openDirect(t, path)
	defer f.Close()
	buf := alignedBuf(mib)
	start := time.Now()
	for off := int64(0); off < size; off += mib {
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	return mbps(size, time.Since(start))
}

func randWrite(t *testing.T, path string, size int64, n int, syncEach bool, seed int) float64 {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(uint64(seed), 1))
	buf := pattern(4096, byte(seed))
	start := time.Now()
	for range n {
		if _, err := f.WriteAt(buf, r.Int64N(size/4096)*4096); err != nil {
			t.Fatal(err)
		}
		if syncEach {
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return float64(n) / time.Since(start).Seconds()
}

func randRead(t *testing.T, path string, size int64, n int, seed int) float64 {
	f := openDirect(t, path)
	defer f.Close()
	r := rand.New(rand.NewPCG(uint64(seed), 2))
	buf := alignedBuf(4096)
	start := time.Now()
	for range n {
		if _, err := f.ReadAt(buf, r.Int64N(size/4096)*4096); err != nil {
			t.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
