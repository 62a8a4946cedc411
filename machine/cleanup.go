package machine

// cleanups is a stack of undo steps for a half-finished operation: run
// them all, newest first, unless the operation succeeded and called
// release.
type cleanups struct {
	fns []func()
}

func (c *cleanups) push(f func()) { c.fns = append(c.fns, f) }

// run undoes everything pushed, newest first.
func (c *cleanups) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// release forgets the steps: the operation succeeded.
func (c *cleanups) release() { c.fns = nil }
