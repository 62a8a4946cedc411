package machine

import (
	"log/slog"
)

// cleanups is the rollback of a half-finished operation: a stack of undo
// steps, run newest first unless the operation succeeded and called
// release. An undo step that fails is logged with what it was undoing;
// the rollback goes on with the next.
type cleanups struct {
	log   *slog.Logger
	steps []undoStep
}

type undoStep struct {
	what string
	undo func() error
}

// push adds an undo step; what names it in the log ("remove the disk").
func (c *cleanups) push(what string, undo func() error) {
	c.steps = append(c.steps, undoStep{what, undo})
}

// run undoes everything pushed, newest first.
func (c *cleanups) run() {
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i].undo(); err != nil && c.log != nil {
			c.log.Warn("den: rollback: "+c.steps[i].what, "err", err)
		}
	}
	c.steps = nil
}

// release forgets the steps: the operation succeeded.
func (c *cleanups) release() { c.steps = nil }
