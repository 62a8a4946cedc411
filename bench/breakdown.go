package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// Breakdown is one operation's steps, as the daemon traced them (the
// floor's, as the bench timed them: there is no daemon): the median of
// each over the runs, so that every millisecond of a wake or a restore
// has a name.
type Breakdown struct {
	Op      string  `json:"op"`
	VMM     string  `json:"vmm"`
	Memory  string  `json:"memory"`
	TotalMS float64 `json:"total_ms"` // median, as the daemon (or, for the floor, the bench) measured it
	// HostCPUMS is the median CPU time the whole host (every process,
	// every core) used while the bench timed the operation; 0 unknown.
	HostCPUMS float64     `json:"host_cpu_ms,omitempty"`
	Steps     []StepStats `json:"steps"`
}

// StepStats is one step's median over the runs, and its share of the
// operation's median total.
type StepStats struct {
	Name     string  `json:"name"`
	MedianMS float64 `json:"median_ms"`
	Share    float64 `json:"share"`
	// Runs is in how many runs the step was seen (a verification runs
	// only when digests were written).
	Runs int `json:"runs"`
}

// traces collects the steps of the operations a run times: the daemon's
// traces, and the floor's own (floor.go).
type traces struct {
	order []string
	by    map[string]*opTraces
}

type opTraces struct {
	op, vmm, mem string
	totals, cpu  []float64
	steps        map[string][]float64
	stepOrder    []string
}

// add fetches the trace of the operation just done on vm, if breakdowns
// are asked for.
func (d *daemon) addTrace(ctx context.Context, o Options, label, mem, vm string) error {
	if !o.Breakdown {
		return nil
	}
	t, err := d.client.Trace(ctx, vm)
	if err != nil {
		return fmt.Errorf("trace of %s: %w", label, err)
	}
	steps := make([]timedStep, 0, len(t.Steps))
	for _, s := range t.Steps {
		steps = append(steps, timedStep{s.Name, s.MS})
	}
	d.traces.add(label, d.vmm, mem, t.TotalMS, d.opCPU, steps)
	d.opCPU = -1
	return nil
}

// timedStep is one step of one run, in milliseconds.
type timedStep struct {
	name string
	ms   float64
}

// add records one run of op: its total, the host's CPU time meanwhile
// (< 0: unknown) and its steps.
func (ts *traces) add(op, vmm, mem string, totalMS, cpuMS float64, steps []timedStep) {
	if ts.by == nil {
		ts.by = map[string]*opTraces{}
	}
	key := vmm + "\x00" + mem + "\x00" + op
	ot := ts.by[key]
	if ot == nil {
		ot = &opTraces{op: op, vmm: vmm, mem: mem, steps: map[string][]float64{}}
		ts.by[key] = ot
		ts.order = append(ts.order, key)
	}
	ot.totals = append(ot.totals, totalMS)
	if cpuMS >= 0 {
		ot.cpu = append(ot.cpu, cpuMS)
	}
	for _, s := range steps {
		if _, ok := ot.steps[s.name]; !ok {
			ot.stepOrder = append(ot.stepOrder, s.name)
		}
		ot.steps[s.name] = append(ot.steps[s.name], s.ms)
	}
}

// breakdowns are the medians of what was collected.
func (ts *traces) breakdowns() []Breakdown {
	var out []Breakdown
	for _, key := range ts.order {
		ot := ts.by[key]
		total, _, _ := stats(ot.totals)
		b := Breakdown{Op: ot.op, VMM: ot.vmm, Memory: ot.mem, TotalMS: total}
		b.HostCPUMS, _, _ = stats(ot.cpu)
		for _, name := range ot.stepOrder {
			med, _, _ := stats(ot.steps[name])
			st := StepStats{Name: name, MedianMS: med, Runs: len(ot.steps[name])}
			if total > 0 {
				st.Share = med / total
			}
			b.Steps = append(b.Steps, st)
		}
		out = append(out, b)
	}
	return out
}

// breakdownMarkdown is the breakdown tables of a result.
func breakdownMarkdown(bs []Breakdown) string {
	var b strings.Builder
	for _, bd := range bs {
		by := "the daemon"
		if strings.HasPrefix(bd.Op, "vmm floor") {
			by = "the bench (QEMU alone, no daemon)"
		}
		cpu := ""
		if bd.HostCPUMS > 0 {
			cpu = fmt.Sprintf("; the host's CPUs were busy %.0f ms meanwhile (every process, every core)", bd.HostCPUMS)
		}
		fmt.Fprintf(&b, "\n**%s** (%s, %s): %.0f ms as %s measured it%s\n\n| step | median | share | runs |\n|---|---:|---:|---:|\n",
			bd.Op, bd.VMM, bd.Memory, bd.TotalMS, by, cpu)
		steps := append([]StepStats(nil), bd.Steps...)
		sort.SliceStable(steps, func(i, j int) bool { return steps[i].MedianMS > steps[j].MedianMS })
		for _, s := range steps {
			fmt.Fprintf(&b, "| %s | %.1f ms | %.0f%% | %d |\n", s.Name, s.MedianMS, 100*s.Share, s.Runs)
		}
	}
	return b.String()
}
