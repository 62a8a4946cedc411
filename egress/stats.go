package egress

import (
	"slices"
	"sync"
)

// lastRefused is how many refused names Stats keeps.
const lastRefused = 16

// stats are one VM's counters; they outlive a Serve that replaces its
// listeners.
type stats struct {
	mu      sync.Mutex
	queries uint64
	refused uint64
	last    []string // oldest first, each name once
}

func (s *stats) query() {
	s.mu.Lock()
	s.queries++
	s.mu.Unlock()
}

// refuse counts a refused query and, if name is not "", remembers name
// as the last one refused.
func (s *stats) refuse(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused++
	if name == "" {
		return
	}
	if i := slices.Index(s.last, name); i >= 0 {
		s.last = slices.Delete(s.last, i, i+1)
	}
	if len(s.last) == lastRefused {
		s.last = slices.Delete(s.last, 0, 1)
	}
	s.last = append(s.last, name)
}

func (s *stats) get() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Queries: s.queries, Refused: s.refused, LastRefused: slices.Clone(s.last)}
}
