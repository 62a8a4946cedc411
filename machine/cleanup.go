package machine

import (
	"log/slog"
)

// cleanups is the rollback of a half-finished operation: a stack of undo
// steps, run newest first unless the operation succeeded and called
// release. Steps pushed with always (what the operation only borrowed:
// a staged disk given back) run either way, in the same order. A step
// that fails is logged with what it was undoing; the rollback goes on
// with the next.
type cleanups struct {
	log   *slog.Logger
	steps []undoStep
}

type undoStep struct {
	what   string
	undo   func() error
	always bool
}

// push adds an undo step; what names it in the log ("remove the disk").
func (c *cleanups) push(what string, undo func() error) {
	c.steps = append(c.steps, undoStep{what: what, undo: undo})
}

// always adds a step that runs when the operation ends, whether it
// failed or not.
func (c *cleanups) always(what string, f func()) {
	c.steps = append(c.steps, undoStep{what: what, undo: func() error { f(); return nil }, always: true})
}

// run undoes everything pushed, newest first.
func (c *cleanups) run() { c.unwind(false) }

// release runs the always steps and forgets the others: the operation
// succeeded.
func (c *cleanups) release() { c.unwind(true) }

func (c *cleanups) unwind(alwaysOnly bool) {
	for i := len(c.steps) - 1; i >= 0; i-- {
		st := c.steps[i]
		if alwaysOnly && !st.always {
			continue
		}
		if err := st.undo(); err != nil && c.log != nil {
			c.log.Warn("den: rollback: "+st.what, "err", err)
		}
	}
	c.steps = nil
}
