package idle

import (
	"context"
	"errors"
	"testing"
	"time"
)

type fakeTarget struct {
	vms     []VM
	samples map[string]Sample
	touched map[string]int
	slept   []string
	fail    error
}

func (f *fakeTarget) Candidates(context.Context) []VM { return f.vms }
func (f *fakeTarget) Activity(_ context.Context, name string) (Sample, error) {
	if f.fail != nil {
		return Sample{}, f.fail
	}
	return f.samples[name], nil
}
func (f *fakeTarget) Touch(name string) { f.touched[name]++ }
func (f *fakeTarget) Sleep(_ context.Context, name string) error {
	f.slept = append(f.slept, name)
	return nil
}

func TestPass(t *testing.T) {
	now := time.Unix(10000, 0)
	old := now.Add(-time.Hour)
	f := &fakeTarget{
		vms: []VM{
			{Name: "idle", Timeout: time.Minute, LastActive: old},
			{Name: "recent", Timeout: time.Minute, LastActive: now.Add(-10 * time.Second)},
			{Name: "session", Timeout: time.Minute, LastActive: old, Sessions: 1},
			{Name: "lease", Timeout: time.Minute, LastActive: old},
			{Name: "busy", Timeout: time.Minute, LastActive: old},
		},
		samples: map[string]Sample{
			"idle":  {CPUBusy: 1, CPUTotal: 100},
			"lease": {Held: true},
			"busy":  {CPUBusy: 50, CPUTotal: 100},
		},
		touched: map[string]int{},
	}
	m := New(f, Policy{}, nil)
	m.now = func() time.Time { return now }
	// First pass: no CPU baseline, so "busy" looks idle too... unless it
	// had a previous sample; give it one.
	m.prev["busy"] = Sample{CPUBusy: 0, CPUTotal: 0}
	m.Pass(context.Background())
	if len(f.slept) != 1 || f.slept[0] != "idle" {
		t.Fatalf("slept %v, want [idle]", f.slept)
	}
	if f.touched["lease"] != 1 || f.touched["busy"] != 1 || f.touched["session"] != 0 {
		t.Fatalf("touched %v", f.touched)
	}
	// A guest that does not answer is never put to sleep on a guess.
	f.slept, f.fail = nil, errors.New("agent gone")
	m.Pass(context.Background())
	if len(f.slept) != 0 {
		t.Fatalf("slept %v without a sample", f.slept)
	}
}

func TestBusy(t *testing.T) {
	if Busy(Sample{}, Sample{CPUBusy: 100, CPUTotal: 100}, false, 0.05) {
		t.Error("busy without a baseline")
	}
	if !Busy(Sample{CPUTotal: 100}, Sample{CPUBusy: 10, CPUTotal: 200}, true, 0.05) {
		t.Error("10% cpu not busy")
	}
	if Busy(Sample{CPUTotal: 100}, Sample{CPUBusy: 1, CPUTotal: 200}, true, 0.05) {
		t.Error("1% cpu busy")
	}
	// The agent's own CPU (answering these samples) is not the guest's:
	// 12% busy of which 10% is the agent is idle; 12% of which 2% is not.
	if Busy(Sample{CPUBusy: 50, CPUTotal: 100, AgentCPU: 30}, Sample{CPUBusy: 62, CPUTotal: 200, AgentCPU: 40}, true, 0.05) {
		t.Error("the agent's own cpu counted as the guest's")
	}
	if !Busy(Sample{CPUBusy: 50, CPUTotal: 100, AgentCPU: 30}, Sample{CPUBusy: 62, CPUTotal: 200, AgentCPU: 32}, true, 0.05) {
		t.Error("10% cpu outside the agent not busy")
	}
	if !Busy(Sample{}, Sample{Sessions: 1}, false, 0.05) {
		t.Error("an agent session is not activity")
	}
}
