package machine

import (
	"testing"
)

// TestAdmitAndCloseExclusive: a session is admitted and a VMM closed
// under one rule: whichever comes first wins, never both.
func TestAdmitAndCloseExclusive(t *testing.T) {
	in := newInstance("x", "", nil)
	if in.admit() {
		t.Fatal("session admitted before the vm was committed")
	}
	in.reopen()
	if !in.admit() {
		t.Fatal("admit on an open instance refused")
	}
	if n, ok := in.close(false); ok || n != 1 {
		t.Fatalf("close with a session open: %d %v", n, ok)
	}
	in.release()
	if _, ok := in.close(false); !ok {
		t.Fatal("close with no session refused")
	}
	if in.admit() {
		t.Fatal("session admitted on a closing instance")
	}
	in.reopen()
	if !in.admit() {
		t.Fatal("admit after reopen refused")
	}
	if n, ok := in.close(true); !ok || n != 1 {
		t.Fatalf("forced close: %d %v", n, ok)
	}
}

// TestInFlightAddWhileWaiting: tasks may start while someone waits for
// those under way (a sync.WaitGroup panics then); wait returns once none
// is left.
func TestInFlightAddWhileWaiting(t *testing.T) {
	var f inFlight
	f.wait() // none under way
	for round := 0; round < 200; round++ {
		f.add()
		waited := make(chan struct{})
		go func() { f.wait(); close(waited) }()
		f.add() // while the other waits
		f.done()
		f.done()
		<-waited
	}
}
