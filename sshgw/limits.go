package sshgw

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/denhq/den/internal/netlimit"
)

// Why accept turns a connection away.
var (
	// errSourceRefused: the source failed to authenticate too often.
	errSourceRefused = errors.New("too many failed authentications from this address")
	// errSourceFull: the source holds MaxUnauthenticatedPerSource.
	errSourceFull = errors.New("too many unauthenticated connections from this address")
)

// admit counts c (from src) as unauthenticated, or says why not: its
// source is refused (too many failed authentications), or holds
// MaxUnauthenticatedPerSource already. At MaxUnauthenticated it makes
// room (netlimit.Conns) and returns the connection it stopped counting as
// victim, for the caller to close. So a flood from some addresses pushes
// out its own connections, never a newcomer from an address of its own,
// and every connection keeps its handshake deadline.
func (s *Server) admit(c net.Conn, src string, now time.Time) (p, victim *netlimit.Conn, err error) {
	if until, refused := s.fails.refused(src, now); refused {
		return nil, nil, fmt.Errorf("%w (refused for %s)", errSourceRefused, until.Sub(now).Round(time.Second))
	}
	p, victim, err = s.pend.Admit(c)
	if errors.Is(err, netlimit.ErrSourceFull) {
		err = errSourceFull
	}
	return p, victim, err
}

// unauthenticated is how many connections are counted, in all and from
// src.
func (s *Server) unauthenticated(src string) (all, from int) { return s.pend.Count(src) }

// failures counts, per source, connections that tried to authenticate
// and ended without succeeding; a source with max of them within window
// has its connections refused for ban. It tracks at most maxSources
// sources: expired records are swept as it goes, and when it is full the
// record least recently added to makes room (one that refuses its source
// only when every record does, then the one whose refusal ends first).
type failures struct {
	max         int
	window, ban time.Duration
	maxSources  int

	mu    sync.Mutex
	m     map[string]*failureRecord
	swept time.Time
}

type failureRecord struct {
	start time.Time // of the current window
	n     int       // failures in it
	last  time.Time // of the last failure
	until time.Time // connections refused until then
}

func newFailures(max int, window, ban time.Duration, maxSources int) *failures {
	return &failures{max: max, window: window, ban: ban, maxSources: maxSources, m: map[string]*failureRecord{}}
}

// expired: the record neither refuses nor counts anything any more.
func (f *failures) expired(r *failureRecord, now time.Time) bool {
	return !now.Before(r.until) && now.Sub(r.start) >= f.window
}

// refused says whether src's connections are refused at now, and until
// when.
func (f *failures) refused(src string, now time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.m[src]
	if r == nil || !now.Before(r.until) {
		return time.Time{}, false
	}
	return r.until, true
}

// add counts a failure of src at now; it says whether src is refused
// from now on (true once, when the failure reaches max).
func (f *failures) add(src string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweep(now)
	r := f.m[src]
	if r == nil {
		if len(f.m) >= f.maxSources {
			f.evict(now)
		}
		r = &failureRecord{start: now}
		f.m[src] = r
	}
	if now.Sub(r.start) >= f.window {
		r.start, r.n = now, 0
	}
	r.n++
	r.last = now
	if r.n < f.max || now.Before(r.until) {
		return false
	}
	r.until = now.Add(f.ban)
	r.start, r.n = r.until, 0 // counting starts again when the refusal ends
	return true
}

// sweep drops expired records, at most once a window unless full.
func (f *failures) sweep(now time.Time) {
	if now.Sub(f.swept) < f.window && len(f.m) < f.maxSources {
		return
	}
	f.swept = now
	for src, r := range f.m {
		if f.expired(r, now) {
			delete(f.m, src)
		}
	}
}

// evict drops one record to make room: of those that refuse nothing, the
// one least recently added to; if every one refuses, the one whose
// refusal ends first.
func (f *failures) evict(now time.Time) {
	var victim string
	var vr *failureRecord
	for src, r := range f.m {
		if vr == nil || f.better(r, vr, now) {
			victim, vr = src, r
		}
	}
	delete(f.m, victim)
}

// better says whether r is a better record to drop than vr.
func (f *failures) better(r, vr *failureRecord, now time.Time) bool {
	refusing, vrefusing := now.Before(r.until), now.Before(vr.until)
	switch {
	case refusing != vrefusing:
		return !refusing
	case !refusing:
		return r.last.Before(vr.last)
	}
	return r.until.Before(vr.until)
}

// size is how many sources are tracked.
func (f *failures) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}
