// Package phase records how long each step of an operation takes, so that
// every millisecond of a wake, restore or create has a name (den bench
// --breakdown).
package phase

import (
	"context"
	"sync"
	"time"
)

// Step is one named step of an operation and how long it took. Steps may
// nest (a restore's "restore call" inside its "wake"); At is when it began,
// from the start of the operation.
type Step struct {
	Name string        `json:"name"`
	At   time.Duration `json:"at"`
	Took time.Duration `json:"took"`
}

// Recorder collects the steps of one operation. Its methods are safe for
// concurrent use (steps that overlap, as a verification beside a VMM's
// start, are recorded as they end).
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	steps []Step
}

// New starts recording an operation.
func New() *Recorder { return &Recorder{start: time.Now()} }

type key struct{}

// With returns ctx carrying r: the steps begun under it are r's.
func With(ctx context.Context, r *Recorder) context.Context {
	return context.WithValue(ctx, key{}, r)
}

// From is the recorder ctx carries, nil if none.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(key{}).(*Recorder)
	return r
}

// Begin starts a step of the operation ctx records (if any); the function
// it returns ends it. Usage: defer phase.Begin(ctx, "restore call")().
func Begin(ctx context.Context, name string) func() {
	r := From(ctx)
	if r == nil {
		return func() {}
	}
	begin := time.Now()
	return func() { r.add(name, begin, time.Since(begin)) }
}

// Record adds a step that ended now and took d.
func Record(ctx context.Context, name string, d time.Duration) {
	RecordEnded(ctx, name, time.Now(), d)
}

// RecordEnded records a step that took d and ended at end: one timed
// elsewhere, as a guest's steps, which end one after the other before
// its answer arrives.
func RecordEnded(ctx context.Context, name string, end time.Time, d time.Duration) {
	if r := From(ctx); r != nil {
		r.add(name, end.Add(-d), d)
	}
}

func (r *Recorder) add(name string, begin time.Time, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, Step{Name: name, At: begin.Sub(r.start), Took: d})
}

// Steps are the steps recorded so far, in the order they began.
func (r *Recorder) Steps() []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]Step(nil), r.steps...)
	for i := 1; i < len(out); i++ { // insertion sort: few steps, mostly in order
		for j := i; j > 0 && out[j].At < out[j-1].At; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// Total is the time since the operation began.
func (r *Recorder) Total() time.Duration { return time.Since(r.start) }
