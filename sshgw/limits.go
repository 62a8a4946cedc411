package sshgw

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"
)

// sourceOf is the address that the per-source limits count a connection
// under: its IPv4 address, or the /64 of its IPv6 address (one host, or
// one customer of a provider, commonly holds a whole /64).
func sourceOf(a net.Addr) string {
	var ap netip.AddrPort
	if t, ok := a.(*net.TCPAddr); ok {
		ap = t.AddrPort()
	} else if p, err := netip.ParseAddrPort(a.String()); err == nil {
		ap = p
	} else {
		return a.String()
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return ip.String()
	}
	return p.String()
}

// Why accept turns a connection away.
var (
	// errSourceRefused: the source failed to authenticate too often.
	errSourceRefused = errors.New("too many failed authentications from this address")
	// errSourceFull: the source holds MaxUnauthenticatedPerSource.
	errSourceFull = errors.New("too many unauthenticated connections from this address")
)

// pending is a connection that has not authenticated yet.
type pending struct {
	c       net.Conn
	src     string
	seq     uint64 // accept order
	tracked bool   // still counted (guarded by Server.mu)
}

// admit counts c (from src) as unauthenticated, or says why not. When
// MaxUnauthenticated are already counted it makes room rather than turn c
// away: it stops counting the oldest connection of the source that holds
// the most (the oldest such connection when several sources tie) and
// returns it as victim, for the caller to close. So a flood from some
// addresses pushes out its own connections, never a newcomer from an
// address of its own, and every connection keeps its handshake deadline.
func (s *Server) admit(c net.Conn, src string, now time.Time) (p, victim *pending, err error) {
	if until, refused := s.fails.refused(src, now); refused {
		return nil, nil, fmt.Errorf("%w (refused for %s)", errSourceRefused, until.Sub(now).Round(time.Second))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pend[src]) >= s.cfg.MaxUnauthenticatedPerSource {
		return nil, nil, errSourceFull
	}
	if s.npend >= s.cfg.MaxUnauthenticated {
		var most []*pending
		for _, l := range s.pend {
			if len(l) > len(most) || len(l) == len(most) && l[0].seq < most[0].seq {
				most = l
			}
		}
		victim = most[0]
		s.untrack(victim)
	}
	s.seq++
	p = &pending{c: c, src: src, seq: s.seq, tracked: true}
	s.pend[src] = append(s.pend[src], p)
	s.npend++
	return p, victim, nil
}

// release stops counting p (it authenticated, or ended); idempotent.
func (s *Server) release(p *pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.untrack(p)
}

// untrack stops counting p; s.mu is held.
func (s *Server) untrack(p *pending) {
	if !p.tracked {
		return
	}
	p.tracked = false
	l := s.pend[p.src]
	for i, q := range l {
		if q == p {
			l = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(s.pend, p.src)
	} else {
		s.pend[p.src] = l
	}
	s.npend--
}

// unauthenticated is how many connections are counted, in all and from
// src.
func (s *Server) unauthenticated(src string) (all, from int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.npend, len(s.pend[src])
}

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

// logLimiter passes on log lines about unauthenticated connections at a
// bounded rate (a token bucket: burst lines at once, then one per every)
// and sums up what it held back in one line, at most once per summary.
type logLimiter struct {
	log     *slog.Logger
	burst   float64
	every   time.Duration
	summary time.Duration

	mu     sync.Mutex
	tokens float64
	last   time.Time
	held   map[string]int // message -> lines held back (messages are constants)
	timer  *time.Timer
	closed bool
}

func newLogLimiter(log *slog.Logger, burst int, every, summary time.Duration) *logLimiter {
	return &logLimiter{log: log, burst: float64(burst), every: every, summary: summary,
		tokens: float64(burst), last: time.Now(), held: map[string]int{}}
}

// Log logs msg with args if a token is left, or counts it for the
// summary.
func (l *logLimiter) Log(level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return // a line nobody would see takes no token
	}
	l.mu.Lock()
	now := time.Now()
	l.tokens = min(l.burst, l.tokens+float64(now.Sub(l.last))/float64(l.every))
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		l.mu.Unlock()
		l.log.Log(ctx, level, msg, args...)
		return
	}
	l.held[msg]++
	if l.timer == nil && !l.closed {
		l.timer = time.AfterFunc(l.summary, l.flush)
	}
	l.mu.Unlock()
}

// flush logs the summary of the lines held back, if any.
func (l *logLimiter) flush() {
	l.mu.Lock()
	held := l.held
	l.held = map[string]int{}
	l.timer = nil
	l.mu.Unlock()
	if len(held) == 0 {
		return
	}
	msgs := make([]string, 0, len(held))
	total := 0
	for m, n := range held {
		msgs = append(msgs, fmt.Sprintf("%d x %q", n, m))
		total += n
	}
	sort.Strings(msgs)
	l.log.Warn("den: ssh gateway: log lines about unauthenticated connections suppressed", "count", total, "lines", strings.Join(msgs, ", "))
}

// close logs the summary now, and no timer after it.
func (l *logLimiter) close() {
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.flush()
}
