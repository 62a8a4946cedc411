package egress

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"
)

// Bounds of one VM's resolver.
const (
	// maxForwards bounds the queries a VM has at the upstreams at once;
	// more get SERVFAIL.
	maxForwards = 128
	// maxTCPConns bounds a VM's open TCP connections; more wait.
	maxTCPConns = 32
	// ioTimeout bounds reading a query from and writing an answer to
	// the VM.
	ioTimeout = 2 * time.Second
	// stopWait bounds how long stop waits for queries under way (their
	// upstream exchanges are cut at once; an Allow call may take time).
	stopWait = 5 * time.Second
)

// served is one VM's listeners, policy and counters.
type served struct {
	r      *Resolver
	vm     string
	addr   netip.Addr // where it listens
	policy atomic.Pointer[Policy]
	stats  *stats
	// ctx ends when the VM is stopped: it cuts upstream exchanges.
	ctx    context.Context
	cancel context.CancelFunc
	// forwards holds a token per query at the upstreams.
	forwards chan struct{}

	pc      net.PacketConn
	ln      net.Listener
	servers []*dns.Server
	// done is closed once both servers returned (after their handlers).
	done chan struct{}
}

// start binds vm's listeners on addr and serves them.
func (r *Resolver) start(vm string, addr netip.AddrPort, p Policy, st *stats) (*served, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{r: r, vm: vm, stats: st, ctx: ctx, cancel: cancel,
		forwards: make(chan struct{}, maxForwards), done: make(chan struct{})}
	s.policy.Store(&p)

	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	s.addr = addr.Addr()
	udp, tcp := "udp4", "tcp4"
	if addr.Addr().Is6() {
		udp, tcp = "udp6", "tcp6"
	}
	lc := net.ListenConfig{Control: Freebind}
	pc, err := lc.ListenPacket(ctx, udp, addr.String())
	if err != nil {
		cancel()
		return nil, err
	}
	ln, err := lc.Listen(ctx, tcp, addr.String())
	if err != nil {
		pc.Close()
		cancel()
		return nil, err
	}
	s.pc, s.ln = pc, netutil.LimitListener(ln, maxTCPConns)

	h := dns.HandlerFunc(s.serveDNS)
	idle := func() time.Duration { return ioTimeout }
	s.servers = []*dns.Server{
		{PacketConn: s.pc, Handler: h, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout},
		{Listener: s.ln, Handler: h, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout, IdleTimeout: idle},
	}
	// Each server reports once: started, or failed before it started.
	ready := make(chan error, len(s.servers))
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		var once sync.Once
		srv.NotifyStartedFunc = func() { once.Do(func() { ready <- nil }) }
		wg.Go(func() {
			err := srv.ActivateAndServe()
			once.Do(func() { ready <- cmp.Or(err, fmt.Errorf("dns server ended before it started")) })
			if err != nil && ctx.Err() == nil {
				r.log.Warn("dns listener failed", "vm", vm, "addr", addr, "err", err)
			}
		})
	}
	go func() {
		wg.Wait()
		close(s.done)
	}()
	var failed error
	for range s.servers {
		if err := <-ready; err != nil && failed == nil {
			failed = err
		}
	}
	if failed != nil {
		s.stop()
		return nil, failed
	}
	return s, nil
}

// stop closes the listeners, cuts the queries under way and waits (at
// most stopWait) for them to end. No Allow call begins afterwards.
func (s *served) stop() {
	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), stopWait)
	defer cancel()
	for _, srv := range s.servers {
		srv.ShutdownContext(ctx) // "not started" if it failed to start: the closes below do
	}
	s.pc.Close()
	s.ln.Close()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.r.log.Warn("dns queries still under way after stop", "vm", s.vm, "waited", stopWait)
	}
}

// allow calls Options.Allow unless the VM is stopped (stop waits for
// the calls that began before); it says whether the answer may go out.
func (s *served) allow(p *Policy, addrs []netip.Addr, ttl time.Duration) bool {
	if s.ctx.Err() != nil {
		return false
	}
	if s.policy.Load() != p {
		// The policy changed while the upstream answered: the answer
		// was made under the old one. The VM asks again.
		return false
	}
	if s.r.o.Allow != nil {
		s.r.o.Allow(s.vm, *p, addrs, ttl)
	}
	return true
}

// Freebind sets IP_FREEBIND (IPV6_FREEBIND) on a socket before it is
// bound, so it may bind an address the host does not have yet (a
// net.ListenConfig's Control).
func Freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if strings.HasSuffix(network, "6") {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		}
	})
	if err = cmp.Or(err, serr); err != nil {
		return fmt.Errorf("set IP_FREEBIND: %w", err)
	}
	return nil
}
