package netlimit

import (
	"errors"
	"net"
	"net/netip"
	"sync"
)

// SourceOf is the address that the per-source limits count a connection
// under: its IPv4 address, or the /64 of its IPv6 address (one host, or
// one customer of a provider, commonly holds a whole /64).
func SourceOf(a net.Addr) string {
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

// ErrSourceFull is Conns.Admit's refusal: the source holds MaxPerSource
// connections already.
var ErrSourceFull = errors.New("too many connections from this address")

// Conns counts connections per source address and in all, with two caps:
// a source that holds MaxPerSource has its next connections refused, and
// when Max are counted a newcomer is admitted by evicting the oldest
// connection of the source that holds the most (the oldest such when
// several tie). So a flood from some addresses pushes out its own
// connections, never a newcomer from an address of its own. Its zero
// value is not usable: make one with NewConns.
type Conns struct {
	max, perSource int

	mu  sync.Mutex
	by  map[string][]*Conn // per source, oldest first
	n   int
	seq uint64
}

// NewConns counts connections with at most max in all and perSource
// from one source address.
func NewConns(max, perSource int) *Conns {
	return &Conns{max: max, perSource: perSource, by: map[string][]*Conn{}}
}

// Conn is one counted connection.
type Conn struct {
	net.Conn
	Source  string
	seq     uint64
	tracked bool // guarded by Conns.mu
}

// Admit counts c, or returns ErrSourceFull. When the cap in all is
// reached it stops counting a victim (see Conns) and returns it, for the
// caller to close.
func (t *Conns) Admit(c net.Conn) (e, victim *Conn, err error) {
	src := SourceOf(c.RemoteAddr())
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.by[src]) >= t.perSource {
		return nil, nil, ErrSourceFull
	}
	if t.n >= t.max {
		var most []*Conn
		for _, l := range t.by {
			if len(l) > len(most) || len(l) == len(most) && l[0].seq < most[0].seq {
				most = l
			}
		}
		victim = most[0]
		t.untrack(victim)
	}
	t.seq++
	e = &Conn{Conn: c, Source: src, seq: t.seq, tracked: true}
	t.by[src] = append(t.by[src], e)
	t.n++
	return e, victim, nil
}

// Release stops counting e (it ended, or needs counting no more);
// idempotent.
func (t *Conns) Release(e *Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.untrack(e)
}

// untrack stops counting e; t.mu is held.
func (t *Conns) untrack(e *Conn) {
	if !e.tracked {
		return
	}
	e.tracked = false
	l := t.by[e.Source]
	for i, q := range l {
		if q == e {
			l = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(t.by, e.Source)
	} else {
		t.by[e.Source] = l
	}
	t.n--
}

// Count is how many connections are counted, in all and from src.
func (t *Conns) Count(src string) (all, from int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n, len(t.by[src])
}
