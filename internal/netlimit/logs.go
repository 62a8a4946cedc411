package netlimit

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
)

// LogLimiter passes on log lines about what clients cause before they
// authenticate at a bounded rate (a token bucket: burst lines at once,
// then one per every) and sums up what it held back in one line, at most
// once per summary. Its messages must be constants: it counts what it
// holds back per message.
type LogLimiter struct {
	log     *slog.Logger
	what    string // names the listener in the summary
	burst   float64
	every   time.Duration
	summary time.Duration

	mu     sync.Mutex
	tokens float64
	last   time.Time
	held   map[string]int // message -> lines held back
	timer  *time.Timer
	closed bool
}

// NewLogLimiter logs to log; what names the listener in the summary line
// ("ssh gateway").
func NewLogLimiter(log *slog.Logger, what string, burst int, every, summary time.Duration) *LogLimiter {
	return &LogLimiter{log: log, what: what, burst: float64(burst), every: every, summary: summary,
		tokens: float64(burst), last: time.Now(), held: map[string]int{}}
}

// Log logs msg with args if a token is left, or counts it for the
// summary.
func (l *LogLimiter) Log(level slog.Level, msg string, args ...any) {
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
func (l *LogLimiter) flush() {
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
	l.log.Warn("den: "+l.what+": log lines about unauthenticated connections suppressed", "count", total, "lines", strings.Join(msgs, ", "))
}

// Close logs the summary now, and no timer after it.
func (l *LogLimiter) Close() {
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.flush()
}
