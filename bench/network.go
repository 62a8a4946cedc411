package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/netns"
)

// netBytes is what a guest sends in one throughput run.
const netBytes = 32 << 20

// netPort is the throughput server's port; the bench name resolves
// through the VMs' resolver.
const (
	netPort   = 5001
	benchName = "bench.test"
)

// networkFigures measures den's network layer in namespaces of its own
// (internal/netns; no traffic leaves them): TCP throughput from a guest to
// a host-side server over a TAP and over QEMU's user-mode network (two
// daemons in the same run), the first byte of an HTTP request through
// --http-listen to a running and to a sleeping VM, and a DNS answer
// through a VM's resolver (an allow-list policy, so the firewall is
// opened for the answer) beside the upstream's own.
func networkFigures(ctx context.Context, o Options, say func(string)) ([]Figure, error) {
	if err := netns.Usable(); err != nil {
		say("network: skipped: " + err.Error())
		return nil, nil
	}
	if _, err := exec.LookPath("nft"); err != nil {
		say("network: skipped: no nft (make deps installs nftables)")
		return nil, nil
	}
	pair, err := netns.NewPair(fmt.Sprintf("bench%d", os.Getpid()%100000))
	if err != nil {
		return nil, err
	}
	defer pair.Close()
	stopDNS, err := serveBenchDNS(pair.WAN)
	if err != nil {
		return nil, err
	}
	defer stopDNS()

	var figs []Figure
	tap, err := startDaemon(ctx, o, variant{name: "qemu", vmm: "qemu", flags: []string{"--netns", pair.Den, "--net", "tap",
		"--dns-upstream", netns.WANAddr, "--http-listen", "127.0.0.1:8081"}})
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	defer tap.stop()
	info, _ := tap.client.Info(ctx)
	accel := info.Accel

	say("network: throughput over a tap")
	ln, err := netns.Listen(pair.WAN, "tcp", fmt.Sprintf("%s:%d", netns.WANAddr, netPort))
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	f, err := tap.throughput(ctx, o, ln, netns.WANAddr, "guest to host TCP (tap)")
	if err != nil {
		return figs, err
	}
	figs = append(figs, f)

	say("network: first byte through --http-listen")
	f2, err := tap.httpFirstByte(ctx, o, pair.Den)
	figs = append(figs, f2...)
	if err != nil {
		return figs, err
	}

	say("network: dns through the vm's resolver")
	f3, err := tap.dnsAnswer(ctx, o, pair.Den)
	figs = append(figs, f3...)
	if err != nil {
		return figs, err
	}
	tap.stop()

	say("network: throughput over qemu's user-mode network")
	user, err := startDaemon(ctx, o, variant{name: "qemu", vmm: "qemu", flags: []string{"--netns", pair.Den, "--net", "user"}})
	if err != nil {
		return figs, fmt.Errorf("network: %w", err)
	}
	defer user.stop()
	uln, err := netns.Listen(pair.Den, "tcp", fmt.Sprintf("127.0.0.1:%d", netPort))
	if err != nil {
		return figs, err
	}
	defer uln.Close()
	f, err = user.throughput(ctx, o, uln, "10.0.2.2", "guest to host TCP (qemu user-mode)")
	if err != nil {
		return figs, err
	}
	figs = append(figs, f)
	for i := range figs { // one accelerator for the whole run: the daemon's
		figs[i].Accel = accel
	}
	return figs, nil
}

// throughput has a guest send netBytes to ln (reached as host from the
// guest) o.Runs times: MB/s, from the first byte to the last as ln sees
// them.
func (d *daemon) throughput(ctx context.Context, o Options, ln net.Listener, host, name string) (Figure, error) {
	f := Figure{Name: name, VMM: d.vmm, Memory: "512M", Unit: "MB/s", Note: fmt.Sprintf("%d MiB with busybox dd | nc, first to last byte at the server; under TCG the guest's CPU is the limit", netBytes>>20)}
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: "tput", IdleTimeout: "0"}, nil); err != nil {
		return f, err
	}
	defer d.client.RemoveVM(ctx, "tput", true)
	for i := 0; i < o.Runs; i++ {
		got := make(chan float64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- 0
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
			buf := make([]byte, 1<<16)
			var n int64
			var first time.Time
			for n < netBytes {
				k, err := c.Read(buf)
				if k > 0 && first.IsZero() {
					first = time.Now()
				}
				n += int64(k)
				if err != nil {
					break
				}
			}
			if n < netBytes {
				got <- 0
				return
			}
			got <- float64(n) / 1e6 / time.Since(first).Seconds()
		}()
		cmd := fmt.Sprintf("dd if=/dev/zero bs=65536 count=%d 2>/dev/null | timeout 300 nc %s %d >/dev/null", netBytes/65536, host, netPort)
		if _, err := d.exec(ctx, "tput", cmd); err != nil {
			return f, fmt.Errorf("%s: %w", name, err)
		}
		select {
		case mbs := <-got:
			if mbs == 0 {
				return f, fmt.Errorf("%s: the server did not get %d bytes", name, netBytes)
			}
			f.Samples = append(f.Samples, mbs)
		case <-time.After(time.Minute):
			return f, fmt.Errorf("%s: no answer from the server", name)
		}
	}
	f.Median, f.Min, f.Max = stats(f.Samples)
	return f, nil
}

// httpFirstByte times a GET through --http-listen to a VM's httpd until
// the first byte of the answer: running, and asleep (the request wakes
// it).
func (d *daemon) httpFirstByte(ctx context.Context, o Options, ns string) ([]Figure, error) {
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: "web", IdleTimeout: "0"}, nil); err != nil {
		return nil, err
	}
	defer d.client.RemoveVM(ctx, "web", true)
	if _, err := d.exec(ctx, "web", "mkdir -p /tmp/www && echo hi > /tmp/www/index.html && httpd -p 8080 -h /tmp/www"); err != nil {
		return nil, err
	}
	u, err := d.client.URL(ctx, "web")
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true, DialContext: netns.Dialer(ns)}}
	// The token as a header, as a script sends it: the URL's query
	// would answer a redirect first.
	target := strings.Replace(u.URL, "?den_token="+u.Token, "", 1)
	get := func() (time.Duration, error) {
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return 0, err
		}
		if u.Token != "" {
			req.Header.Set("Authorization", "Bearer "+u.Token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var b [1]byte
		if _, err := io.ReadFull(resp.Body, b[:]); err != nil || resp.StatusCode != 200 {
			return 0, fmt.Errorf("GET %s: %d %v", target, resp.StatusCode, err)
		}
		return time.Since(start), nil
	}
	if _, err := get(); err != nil { // warm-up
		return nil, err
	}
	var running, sleeping []time.Duration
	for i := 0; i < o.Runs; i++ {
		t, err := get()
		if err != nil {
			return nil, err
		}
		running = append(running, t)
		if _, err := d.client.Sleep(ctx, "web", api.SleepRequest{}); err != nil {
			return nil, err
		}
		if t, err = get(); err != nil {
			return nil, err
		}
		sleeping = append(sleeping, t)
	}
	return []Figure{
		figure("HTTP first byte through --http-listen (running vm)", d.vmm, "", "512M", running),
		figure("HTTP first byte through --http-listen (sleeping vm, woken)", d.vmm, "", "512M", sleeping),
	}, nil
}

// dnsAnswer times an A query through a VM's resolver (its policy allows
// the name, so every answer opens the firewall: an nft transaction) and
// the same query to the upstream itself.
func (d *daemon) dnsAnswer(ctx context.Context, o Options, ns string) ([]Figure, error) {
	resolverOf := func(name, policy string) (string, error) {
		if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, IdleTimeout: "0", Egress: policy}, nil); err != nil {
			return "", err
		}
		n, err := d.client.Net(ctx, name)
		if err != nil {
			return "", err
		}
		p, err := netip.ParsePrefix(n.IP)
		if err != nil {
			return "", fmt.Errorf("vm %s's address %q: %w", name, n.IP, err)
		}
		return p.Addr().Prev().String() + ":53", nil // the host side of its /30
	}
	defer d.client.RemoveVM(ctx, "dns", true)
	defer d.client.RemoveVM(ctx, "dnsall", true)
	resolver, err := resolverOf("dns", "allow:"+benchName)
	if err != nil {
		return nil, err
	}
	forwarder, err := resolverOf("dnsall", "allow-all")
	if err != nil {
		return nil, err
	}
	ask := func(server string) (time.Duration, error) {
		var took time.Duration
		err := netns.In(ns, func() error {
			m := new(dns.Msg)
			m.SetQuestion(benchName+".", dns.TypeA)
			c := &dns.Client{Timeout: 5 * time.Second}
			start := time.Now()
			r, _, err := c.Exchange(m, server)
			took = time.Since(start)
			if err == nil && (r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0) {
				err = fmt.Errorf("answer %s", dns.RcodeToString[r.Rcode])
			}
			return err
		})
		return took, err
	}
	first, err := ask(resolver) // the answer opens the firewall: an nft transaction
	if err != nil {
		return nil, fmt.Errorf("dns through the vm's resolver %s: %w", resolver, err)
	}
	var via, all, direct []time.Duration
	for i := 0; i < o.Runs*3; i++ {
		for _, q := range []struct {
			server string
			ds     *[]time.Duration
		}{{resolver, &via}, {forwarder, &all}, {netns.WANAddr + ":53", &direct}} {
			t, err := ask(q.server)
			if err != nil {
				return nil, fmt.Errorf("dns through %s: %w", q.server, err)
			}
			*q.ds = append(*q.ds, t)
		}
	}
	return []Figure{
		figure("DNS answer through the vm's resolver, allow-list, first (opens the firewall)", d.vmm, "", "512M", []time.Duration{first}),
		figure("DNS answer through the vm's resolver, allow-list, again", d.vmm, "", "512M", via),
		figure("DNS answer through the vm's resolver, allow-all", d.vmm, "", "512M", all),
		figure("DNS answer from the upstream directly", d.vmm, "", "512M", direct),
	}, nil
}

// serveBenchDNS answers benchName on the wan's DNS port.
func serveBenchDNS(wan string) (func(), error) {
	pc, err := netns.ListenPacket(wan, "udp", netns.WANAddr+":53")
	if err != nil {
		return nil, err
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if strings.TrimSuffix(q.Question[0].Name, ".") == benchName && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(netns.WANHostA)})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() {
		if err := srv.ActivateAndServe(); err != nil && !errors.Is(err, net.ErrClosed) {
			fmt.Fprintln(os.Stderr, "bench dns:", err)
		}
	}()
	return func() { _ = srv.Shutdown() }, nil
}
