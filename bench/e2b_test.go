package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// p99 is by nearest rank: with fewer than 100 samples it is the largest.
func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if p := percentile(xs, 99); p != 5 {
		t.Errorf("p99 of %v: %v", xs, p)
	}
	if p := percentile(xs, 50); p != 3 {
		t.Errorf("p50 of %v: %v", xs, p)
	}
	var many []float64
	for i := range 200 {
		many = append(many, float64(i+1))
	}
	if p := percentile(many, 99); p != 198 {
		t.Errorf("p99 of 1..200: %v", p)
	}
	if p := percentile(nil, 99); p != 0 {
		t.Errorf("p99 of none: %v", p)
	}
}

// Each side's runs make the same figures, with p99s; the ratios are the
// SDK's over the CLI path's, and the tables show the p99 column.
func TestE2BFiguresAndRatios(t *testing.T) {
	run := func(ms int) e2bRun {
		d := time.Duration(ms) * time.Millisecond
		return e2bRun{create: d, pause: d, connect: d, forks: map[int]time.Duration{4: 4 * d, 16: 16 * d}}
	}
	r := Result{VMMs: map[string]string{"qemu": "QEMU"}}
	r.Figures = append(e2bFigures("qemu", "tcg", sdkSide, []e2bRun{run(120), run(110), run(300)}),
		e2bFigures("qemu", "tcg", cliSide, []e2bRun{run(100), run(100), run(200)})...)
	r.ratios()
	f := r.figure(e2bForkEach(16), "qemu, e2b sdk")
	if f == nil || f.Median != 120 || f.P99 != 300 || f.Max != 300 {
		t.Fatalf("sdk fork x16 per fork: %+v", f)
	}
	if got := r.Ratios["qemu: e2b sdk / cli, "+e2bCreate+", p50"]; got != 1.2 {
		t.Errorf("create p50 ratio: %v (%v)", got, r.Ratios)
	}
	if got := r.Ratios["qemu: e2b sdk / cli, "+e2bForkTotal(4)+", p99"]; got != 1.5 {
		t.Errorf("fork x4 p99 ratio: %v", got)
	}
	if md := Markdown(r); !strings.Contains(md, "| median | min | max | p99 |") || !strings.Contains(md, "| 120 ms | 110 ms | 300 ms | 300 ms |") {
		t.Errorf("markdown:\n%s", md)
	}
	if md := Markdown(Result{Figures: []Figure{{Name: "x", Unit: "ms"}}}); strings.Contains(md, "p99") {
		t.Errorf("a result without p99s has its column:\n%s", md)
	}
}

// node missing or the SDK not installed is one clear line.
func TestE2BCheck(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if _, _, err := E2BCheck(dir); err == nil || !strings.Contains(err.Error(), "node is not installed") || strings.Contains(err.Error(), "\n") {
		t.Errorf("no node: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := E2BCheck(dir); err == nil || !strings.Contains(err.Error(), "no bench.mjs") {
		t.Errorf("no script: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.mjs"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := E2BCheck(dir); err == nil || !strings.Contains(err.Error(), "make deps-node") {
		t.Errorf("no sdk: %v", err)
	}
}
