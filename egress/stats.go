package egress

import (
	"net/netip"
	"slices"
	"sync"
)

// lastRefused is how many refused names Stats keeps.
const lastRefused = 16

// maxNames bounds each of the two generations of addresses answered.
const maxNames = 2048

// stats are one VM's counters and the names its answers gave addresses;
// they outlive a Serve that replaces its listeners.
type stats struct {
	mu      sync.Mutex
	queries uint64
	refused uint64
	last    []string // oldest first, each name once
	// names maps an address answered to the name asked: the newer
	// generation, and the one before it.
	names, older map[netip.Addr]string
}

// answered remembers that the answer for name gave addrs.
func (s *stats) answered(name string, addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addrs {
		if s.names == nil || len(s.names) >= maxNames {
			s.older, s.names = s.names, make(map[netip.Addr]string)
		}
		s.names[a] = name
	}
}

// nameOf is the name whose answer last gave a, if it is remembered.
func (s *stats) nameOf(a netip.Addr) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.names[a]; ok {
		return n
	}
	return s.older[a]
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
