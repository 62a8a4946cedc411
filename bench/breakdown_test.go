package bench

import (
	"math"
	"os"
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

// The busy time is /proc/stat's first line less idle and iowait, in
// ms; anything else is unknown.
func TestBusyMS(t *testing.T) {
	stat := "cpu  100 5 40 9000 300 2 3 7 50 0\ncpu0 50 2 20 4500 150 1 1 3 25 0\n"
	if got := busyMS(stat); got != (100+5+40+2+3+7)*10 {
		t.Errorf("busy of %q: %v ms", stat, got)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu 1 x 3 4 5 6 7 8\n"} {
		if got := busyMS(bad); got != -1 {
			t.Errorf("busy of %q: %v, want -1", bad, got)
		}
	}
}

// On Linux, a span over 200 ms of spinning measures at least half of it
// (the spin is busy all along, and the host counts steal as busy too).
func TestHostCPU(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat here")
	}
	span := startCPU()
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
	}
	if got := span.ms(); got < 100 {
		t.Fatalf("host CPU over 200 ms of busy work: %v ms", got)
	}
}

// The floor gives its identities' figures only when both were timed as
// often.
func TestFloorFigures(t *testing.T) {
	f := &floor{identity: true, fig: Figure{Name: floorName, Samples: []float64{500}},
		idFirst: Figure{Name: identityFirst}, idAgain: Figure{Name: identityAgain}}
	if got := f.figures(); len(got) != 1 {
		t.Fatalf("figures without identity samples: %+v", got)
	}
	f.idFirst.Samples, f.idAgain.Samples = []float64{300, 280, 320}, []float64{90, 100, 80}
	got := f.figures()
	if len(got) != 3 || got[1].Name != identityFirst || got[1].Median != 300 || got[2].Median != 90 {
		t.Fatalf("figures: %+v", got)
	}
	r := Result{VMMs: map[string]string{"qemu": "7.2"}}
	for _, fig := range got {
		fig.VMM, fig.Memory = "qemu", "512M"
		r.Figures = append(r.Figures, fig)
	}
	r.ratios()
	if got := r.Ratios["qemu: vmm floor: new identity first / again"]; math.Abs(got-300.0/90) > 1e-9 {
		t.Errorf("identity ratio: %v (ratios %v)", got, r.Ratios)
	}
}
