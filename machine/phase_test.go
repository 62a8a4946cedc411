package machine_test

import (
	"slices"
	"testing"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/machine"
)

// TestOperationsTraceTheirSteps: sleep, wake and checkpoint record their
// steps (den bench --breakdown names where the time goes), each step
// within the operation.
func TestOperationsTraceTheirSteps(t *testing.T) {
	e := newEnv(t)
	e.create("box")
	for _, c := range []struct {
		op   string
		run  func(r *phase.Recorder) error
		want []string
	}{
		{"checkpoint", func(r *phase.Recorder) error {
			_, err := e.m.Checkpoint(phase.With(ctxT(t), r), "box", machine.CheckpointOptions{}, nil)
			return err
		}, []string{"lock", "pause", "vmm snapshot", "clone disk", "resume", "commit (rename, record)"}},
		{"sleep", func(r *phase.Recorder) error { return e.m.Sleep(phase.With(ctxT(t), r), "box", false) },
			[]string{"lock", "pause", "vmm snapshot", "registry", "stop vmm"}},
		{"wake", func(r *phase.Recorder) error { return e.m.Wake(phase.With(ctxT(t), r), "box") },
			[]string{"lock", "start vmm", "vmm restore", "agent reconnect", "registry"}},
	} {
		r := phase.New()
		if err := c.run(r); err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		var names []string
		for _, s := range r.Steps() {
			names = append(names, s.Name)
			if s.At+s.Took > r.Total() {
				t.Errorf("%s: step %q ends after the operation", c.op, s.Name)
			}
		}
		for _, w := range c.want {
			if !slices.Contains(names, w) {
				t.Errorf("%s: no step %q in %v", c.op, w, names)
			}
		}
	}
}
