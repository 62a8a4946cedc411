package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// Breakdown is one operation's steps, as the daemon traced them: the
// median of each over the runs, so that every millisecond of a wake or a
// restore has a name.
type Breakdown struct {
	Op      string      `json:"op"`
	VMM     string      `json:"vmm"`
	Memory  string      `json:"memory"`
	TotalMS float64     `json:"total_ms"` // median, as the daemon measured it
	Steps   []StepStats `json:"steps"`
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

// traces collects the daemon's traces of the operations a run times.
type traces struct {
	order []string
	by    map[string]*opTraces
}

type opTraces struct {
	op, vmm, mem string
	totals       []float64
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
	if d.traces.by == nil {
		d.traces.by = map[string]*opTraces{}
	}
	key := d.vmm + "\x00" + mem + "\x00" + label
	ot := d.traces.by[key]
	if ot == nil {
		ot = &opTraces{op: label, vmm: d.vmm, mem: mem, steps: map[string][]float64{}}
		d.traces.by[key] = ot
		d.traces.order = append(d.traces.order, key)
	}
	ot.totals = append(ot.totals, t.TotalMS)
	for _, s := range t.Steps {
		if _, ok := ot.steps[s.Name]; !ok {
			ot.stepOrder = append(ot.stepOrder, s.Name)
		}
		ot.steps[s.Name] = append(ot.steps[s.Name], s.MS)
	}
	return nil
}

// breakdowns are the medians of what was collected.
func (d *daemon) breakdowns() []Breakdown {
	var out []Breakdown
	for _, key := range d.traces.order {
		ot := d.traces.by[key]
		total, _, _ := stats(ot.totals)
		b := Breakdown{Op: ot.op, VMM: ot.vmm, Memory: ot.mem, TotalMS: total}
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
		fmt.Fprintf(&b, "\n**%s** (%s, %s): %.0f ms as the daemon measured it\n\n| step | median | share | runs |\n|---|---:|---:|---:|\n",
			bd.Op, bd.VMM, bd.Memory, bd.TotalMS)
		steps := append([]StepStats(nil), bd.Steps...)
		sort.SliceStable(steps, func(i, j int) bool { return steps[i].MedianMS > steps[j].MedianMS })
		for _, s := range steps {
			fmt.Fprintf(&b, "| %s | %.1f ms | %.0f%% | %d |\n", s.Name, s.MedianMS, 100*s.Share, s.Runs)
		}
	}
	return b.String()
}
