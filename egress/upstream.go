package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Upstreams are the nameservers of a resolv.conf file (the path), as
// host:port with port 53, in the file's order. It is an error if there
// are none.
func Upstreams(resolvConf string) ([]string, error) {
	f, err := os.Open(resolvConf)
	if err != nil {
		return nil, fmt.Errorf("dns upstreams: %w", err)
	}
	defer f.Close()
	var ups []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil {
			continue
		}
		up := netip.AddrPortFrom(a.Unmap(), 53).String()
		if !slices.Contains(ups, up) {
			ups = append(ups, up)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dns upstreams: read %s: %w", resolvConf, err)
	}
	if len(ups) == 0 {
		return nil, fmt.Errorf("dns upstreams: no nameserver in %s", resolvConf)
	}
	return ups, nil
}

// resolvConf is the upstreams of a resolv.conf file, read again when
// the file changes.
type resolvConf struct {
	path string

	mu   sync.Mutex
	mod  time.Time
	size int64
	ups  []string
	err  error
}

func (c *resolvConf) get() ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(c.path)
	if err != nil {
		return nil, fmt.Errorf("dns upstreams: %w", err)
	}
	if c.ups == nil && c.err == nil || !fi.ModTime().Equal(c.mod) || fi.Size() != c.size {
		c.mod, c.size = fi.ModTime(), fi.Size()
		c.ups, c.err = Upstreams(c.path)
	}
	return c.ups, c.err
}

// upstreams are the servers to ask, in order.
func (r *Resolver) upstreams() ([]string, error) {
	if r.conf == nil {
		return r.o.Upstreams, nil
	}
	return r.conf.get()
}

// forward asks the upstreams q, in order, until one answers (NOERROR
// or NXDOMAIN) within Timeout; it retries a truncated answer over TCP.
// It ends when ctx does.
func (r *Resolver) forward(ctx context.Context, req *dns.Msg, q dns.Question) (*dns.Msg, error) {
	ups, err := r.upstreams()
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	m.SetQuestion(q.Name, q.Qtype)
	m.CheckingDisabled = req.CheckingDisabled
	do := false
	if opt := req.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	m.SetEdns0(ednsSize, do)
	var errs []error
	for _, up := range ups {
		resp, err := r.exchange(ctx, m, up)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
	}
	return nil, errors.Join(errs...)
}

// exchange asks one upstream, over UDP then, if the answer is
// truncated, over TCP, within Timeout in all.
func (r *Resolver) exchange(ctx context.Context, m *dns.Msg, up string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	resp, err := r.exchangeOver(ctx, "udp", m, up)
	if err == nil && resp.Truncated {
		resp, err = r.exchangeOver(ctx, "tcp", m, up)
	}
	if err != nil {
		return nil, err
	}
	q := m.Question[0]
	switch {
	case !resp.Response || len(resp.Question) != 1 || resp.Question[0].Qtype != q.Qtype ||
		resp.Question[0].Qclass != q.Qclass || !strings.EqualFold(resp.Question[0].Name, q.Name):
		return nil, errors.New("the answer is not to the question")
	case resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError:
		return nil, fmt.Errorf("answered %s", dns.RcodeToString[resp.Rcode])
	}
	return resp, nil
}

// exchangeOver sends m to up over network (udp or tcp) and reads the
// answer, until ctx ends.
func (r *Resolver) exchangeOver(ctx context.Context, network string, m *dns.Msg, up string) (*dns.Msg, error) {
	m.Id = dns.Id()
	c := &dns.Client{Net: network, Timeout: r.o.Timeout, UDPSize: ednsSize}
	conn, err := c.DialContext(ctx, up)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// The exchange obeys ctx's deadline, not its end: close the
	// connection when it ends (the VM stopped).
	unwatch := context.AfterFunc(ctx, func() { conn.Close() })
	defer unwatch()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	if err != nil {
		return nil, fmt.Errorf("over %s: %w", network, err)
	}
	return resp, nil
}

// upstreamWarnEvery bounds how often the resolver warns that its
// upstreams failed; the failures in between are logged at debug level.
const upstreamWarnEvery = time.Minute

// warnUpstream logs that no upstream answered a VM's query.
func (r *Resolver) warnUpstream(vm, name string, err error) {
	now := time.Now().UnixNano()
	last := r.lastWarn.Load()
	level := slog.LevelDebug
	if now-last >= int64(upstreamWarnEvery) && r.lastWarn.CompareAndSwap(last, now) {
		level = slog.LevelWarn
	}
	r.log.Log(context.Background(), level, "dns query failed: no upstream answered", "vm", vm, "name", name, "err", err)
}
