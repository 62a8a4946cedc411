package poll

import (
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	n := 0
	if !Until(10*time.Second, func() bool { n++; return n == 5 }) || n != 5 {
		t.Fatalf("a condition that holds on the 5th check: %d checks", n)
	}
	start := time.Now()
	if Until(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds held")
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Fatalf("gave up after %s, before its deadline", time.Since(start))
	}
}
