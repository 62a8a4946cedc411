package phase

import (
	"context"
	"testing"
	"time"
)

func TestSteps(t *testing.T) {
	r := New()
	ctx := With(context.Background(), r)
	outer := Begin(ctx, "wake")
	inner := Begin(ctx, "restore call")
	inner()
	Record(ctx, "lock wait", 0)
	outer()
	Begin(context.Background(), "nothing records this")()
	steps := r.Steps()
	if len(steps) != 3 || steps[0].Name != "wake" || steps[1].Name != "restore call" {
		t.Fatalf("steps %+v", steps)
	}
	for _, s := range steps {
		if s.Took < 0 || s.At < 0 || s.At > r.Total() {
			t.Fatalf("step %+v of %s", s, r.Total())
		}
	}
	if steps[0].Took < steps[1].Took {
		t.Fatalf("the outer step is shorter than the inner: %+v", steps)
	}
	if From(context.Background()) != nil {
		t.Fatal("a recorder from nowhere")
	}
	_ = time.Now()
}
