package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The breakdown of an operation is the median of each step over its
// runs, and its share of the median total; a step seen in some runs only
// says in how many.
func TestTracesBreakdowns(t *testing.T) {
	var ts traces
	ts.add("wake", "qemu", "512M", 500, 900, []timedStep{{"vmm restore", 150}, {"agent reconnect", 340}})
	ts.add("wake", "qemu", "512M", 600, -1, []timedStep{{"vmm restore", 170}, {"agent reconnect", 420}, {"verify", 10}})
	ts.add("wake", "qemu", "512M", 700, 1100, []timedStep{{"vmm restore", 160}, {"agent reconnect", 380}})
	ts.add(floorInTurn, "qemu", "2G", 530, -1, []timedStep{{"agent ready", 330}})
	bs := ts.breakdowns()
	if len(bs) != 2 || bs[0].Op != "wake" || bs[1].Op != floorInTurn || bs[1].Memory != "2G" {
		t.Fatalf("breakdowns: %+v", bs)
	}
	w := bs[0]
	// The host's CPU time is the median of the runs that measured it.
	if w.TotalMS != 600 || len(w.Steps) != 3 || w.HostCPUMS != 1000 || bs[1].HostCPUMS != 0 {
		t.Fatalf("wake: %+v", w)
	}
	md := breakdownMarkdown(bs)
	if !strings.Contains(md, "**wake** (qemu, 512M): 600 ms as the daemon measured it; the host's CPUs were busy 1000 ms meanwhile") ||
		!strings.Contains(md, "**"+floorInTurn+"** (qemu, 2G): 530 ms as the bench (QEMU alone, no daemon) measured it\n") {
		t.Errorf("markdown:\n%s", md)
	}
	want := []StepStats{{"vmm restore", 160, 160.0 / 600, 3}, {"agent reconnect", 380, 380.0 / 600, 3}, {"verify", 10, 10.0 / 600, 1}}
	for i, s := range w.Steps {
		if s.Name != want[i].Name || s.MedianMS != want[i].MedianMS || s.Runs != want[i].Runs || math.Abs(s.Share-want[i].Share) > 1e-9 {
			t.Errorf("step %d: %+v, want %+v", i, s, want[i])
		}
	}
}

// The size ratios are set against the floor's own, taken in the same
// turns: what the VMM alone spends more on the larger guest, and den's
// time above the floor at each size.
func TestSizeRatiosAgainstTheFloor(t *testing.T) {
	r := Result{VMMs: map[string]string{"qemu": "7.2"}, Figures: []Figure{
		{Name: wakeInTurn, VMM: "qemu", Memory: "512M", Median: 560},
		{Name: wakeInTurn, VMM: "qemu", Memory: "2G", Median: 600},
		{Name: floorInTurn, VMM: "qemu", Memory: "512M", Median: 500},
		{Name: floorInTurn, VMM: "qemu", Memory: "2G", Median: 530},
	}}
	r.ratios()
	for name, want := range map[string]float64{
		"qemu: wake(2 GiB) / wake(512 MiB), in turn":                             600.0 / 560,
		"qemu: vmm floor(2 GiB) / vmm floor(512 MiB), in turn":                   530.0 / 500,
		"qemu: (wake - vmm floor)(2 GiB) / (wake - vmm floor)(512 MiB), in turn": 70.0 / 60,
	} {
		if got, ok := r.Ratios[name]; !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	// A den figure at or under its floor gives no ratio of overheads.
	r.Figures[1].Median = 520
	r.ratios()
	if got, ok := r.Ratios["qemu: (wake - vmm floor)(2 GiB) / (wake - vmm floor)(512 MiB), in turn"]; ok {
		t.Errorf("overhead ratio with no overhead at 2G: %v", got)
	}
	// A VMM without a floor (Cloud Hypervisor) has the wakes' ratio, and
	// none set against a floor.
	r = Result{VMMs: map[string]string{"cloud-hypervisor": "v48"}, Figures: []Figure{
		{Name: wakeInTurn, VMM: "cloud-hypervisor", Memory: "512M", Median: 60},
		{Name: wakeInTurn, VMM: "cloud-hypervisor", Memory: "2G", Median: 66},
	}}
	r.ratios()
	if got := r.Ratios["cloud-hypervisor: wake(2 GiB) / wake(512 MiB), in turn"]; len(r.Ratios) != 1 || math.Abs(got-1.1) > 1e-9 {
		t.Errorf("ratios without a floor: %v", r.Ratios)
	}
}

// A span over 200 ms of spinning measures at least half of it (the spin
// is busy all along, and the host counts steal as busy too).
func TestHostCPU(t *testing.T) {
	span := startCPU()
	if span.start < 0 {
		t.Skip("no /proc/stat here")
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	n := 0
	for time.Now().Before(deadline) {
		n++
	}
	if got := span.ms(); got < 100 || n == 0 {
		t.Fatalf("host CPU over 200 ms of busy work: %v ms", got)
	}
	if later := hostCPUms(); later < span.start {
		t.Fatalf("host CPU went back: %v then %v", span.start, later)
	}
}
