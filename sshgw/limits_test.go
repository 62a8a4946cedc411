package sshgw

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/testutil"
)

func TestLongUserNameRefused(t *testing.T) {
	logs := &testutil.Buffer{}
	f := newFixture(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	long := "box" + strings.Repeat("x", 64<<10)
	var banner string
	_, err := gossh.Dial("tcp", f.srv.Addr().String(), &gossh.ClientConfig{
		User: long, Auth: []gossh.AuthMethod{gossh.PublicKeys(f.alice)},
		HostKeyCallback: gossh.FixedHostKey(f.hostKey.PublicKey()), Timeout: 10 * time.Second,
		BannerCallback: func(m string) error { banner = m; return nil },
	})
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("64 KiB user name: %v", err)
	}
	if !strings.Contains(banner, "user name is too long (65539 bytes; the limit is 256)") || len(banner) > 200 {
		t.Fatalf("banner %q", banner)
	}
	testutil.WaitFor(t, "the expected state", func() bool { return strings.Contains(logs.String(), "user name too long") })
	if l := logs.String(); strings.Contains(l, strings.Repeat("x", 100)) || !strings.Contains(l, `(65539 bytes)`) {
		t.Fatalf("log: %.300q", l)
	}
	if f.b.opens.Load() != 0 {
		t.Fatal("a VM was claimed")
	}
	// At the limit is fine (it is not a VM, so refused after login).
	c, err := f.dial(strings.Repeat("b", MaxUserName), f.alice)
	if err != nil {
		t.Fatalf("user name of %d bytes: %v", MaxUserName, err)
	}
	c.Close()
}

func TestChannelCap(t *testing.T) {
	const max = 4
	f := newFixture(t, func(c *Config) { c.MaxChannels = max })
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var open []gossh.Channel
	for i := 0; i < max; i++ {
		ch, reqs, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("channel %d: %v", i, err)
		}
		go gossh.DiscardRequests(reqs)
		open = append(open, ch)
	}
	// 1,000 more at once are refused, and say why.
	for i := 0; i < 1000; i++ {
		_, _, err := c.OpenChannel("session", nil)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, "too many channels open on this connection (the limit is 4)") {
			t.Fatalf("channel over the cap: %v", err)
		}
	}
	// Closing one makes room.
	open[0].Close()
	testutil.WaitFor(t, "the expected state", func() bool {
		s, err := c.NewSession()
		if err != nil {
			return false
		}
		defer s.Close()
		err = s.Run("exit 3")
		var ee *gossh.ExitError
		return errors.As(err, &ee) && ee.ExitStatus() == 3
	})
	for _, ch := range open[1:] {
		ch.Close()
	}
	// Another connection has its own count.
	c2, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, _, code := run(t, c2, "exit 5"); code != 5 {
		t.Fatalf("second connection: %d", code)
	}
}

func TestUnauthenticatedPerSource(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.MaxUnauthenticated = 10
		c.MaxUnauthenticatedPerSource = 2
	})
	dial := func(from string) net.Conn { return f.raw(t, from) }
	admitted := versionLine
	a1, a2 := dial("127.0.0.1"), dial("127.0.0.1")
	if !admitted(a1) || !admitted(a2) {
		t.Fatal("connections under the per-source cap refused")
	}
	if admitted(dial("127.0.0.1")) {
		t.Fatal("a third unauthenticated connection from one address admitted")
	}
	// Another address has slots of its own.
	if !admitted(dial("127.0.0.2")) {
		t.Fatal("another address refused")
	}
	// A slot is freed when its connection ends.
	a1.Close()
	testutil.WaitFor(t, "the expected state", func() bool { return admitted(dial("127.0.0.1")) })
	// An authenticated connection holds no slot.
	for i := 0; i < 3; i++ {
		c, err := f.dialFrom(t, "127.0.0.3", "box", f.alice)
		if err != nil {
			t.Fatalf("authenticated connection %d: %v", i, err)
		}
		if _, _, code := run(t, c, "exit 4"); code != 4 {
			t.Fatalf("authenticated connection %d: exit %d", i, code)
		}
	}
}

// quiet is a logger that drops everything (floods log a lot).
func quiet(c *Config) { c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) }

// flood opens 200 unauthenticated connections spread over 127.0.0.2 to
// 127.0.0.30 and 40 from 127.0.0.31, and leaves them silent; it returns
// them and how many of each group the gateway admitted.
func flood(t *testing.T, f *fixture) (spread, one []net.Conn, admittedSpread, admittedOne int) {
	t.Helper()
	for i := 0; i < 200; i++ {
		c := f.raw(t, fmt.Sprintf("127.0.0.%d", 2+i%29))
		if versionLine(c) {
			admittedSpread++
		}
		spread = append(spread, c)
	}
	for i := 0; i < 40; i++ {
		c := f.raw(t, "127.0.0.31")
		if versionLine(c) {
			admittedOne++
		}
		one = append(one, c)
	}
	return spread, one, admittedSpread, admittedOne
}

// The case: 200 unauthenticated connections held open, and 40
// from one address, do not stop a login from another address, with the
// default limits and with a global limit the flood overflows.
func TestUnauthenticatedFlood(t *testing.T) {
	login := func(t *testing.T, f *fixture) {
		t.Helper()
		for i := 0; i < 3; i++ {
			c, err := f.dialFrom(t, "127.0.0.1", "box", f.alice)
			if err != nil {
				t.Fatalf("login %d during the flood: %v", i, err)
			}
			if _, _, code := run(t, c, "exit 4"); code != 4 {
				t.Fatalf("login %d during the flood: exit %d", i, code)
			}
		}
	}
	t.Run("defaults", func(t *testing.T) {
		f := newFixture(t, quiet)
		_, _, spread, one := flood(t, f)
		if spread != 200 || one != DefaultMaxUnauthenticatedPerSource {
			t.Fatalf("admitted %d of 200 spread, %d of 40 from one address", spread, one)
		}
		login(t, f)
		// The flood is still there: nothing was closed to let it in.
		if all, _ := f.srv.unauthenticated(""); all != 200+DefaultMaxUnauthenticatedPerSource {
			t.Fatalf("%d unauthenticated connections held", all)
		}
	})
	t.Run("full", func(t *testing.T) {
		const max = 64
		f := newFixture(t, func(c *Config) { quiet(c); c.MaxUnauthenticated = max })
		spreadConns, oneConns, spread, one := flood(t, f)
		// Every newcomer is admitted: one from the address holding the
		// most closes its own oldest, so that address never reaches its
		// own limit.
		if spread != 200 || one != 40 {
			t.Fatalf("admitted %d of 200 spread, %d of 40 from one address", spread, one)
		}
		if all, _ := f.srv.unauthenticated(""); all != max {
			t.Fatalf("%d unauthenticated connections held, want %d", all, max)
		}
		// The ones closed to make room were the oldest of the biggest
		// holders: the first ones of the spread flood, none of the last
		// round.
		if !closedByServer(spreadConns[0]) {
			t.Fatal("the oldest connection of the flood is still open")
		}
		for _, c := range oneConns[:DefaultMaxUnauthenticatedPerSource] {
			if !closedByServer(c) {
				t.Fatal("the address holding the most kept an old connection")
			}
		}
		login(t, f)
		if _, from := f.srv.unauthenticated("127.0.0.1"); from != 0 {
			t.Fatalf("%d of the logins still counted", from)
		}
		for _, src := range []string{"127.0.0.2", "127.0.0.30", "127.0.0.31"} {
			if _, from := f.srv.unauthenticated(src); from > 3 {
				t.Fatalf("%s holds %d of %d slots", src, from, max)
			}
		}
	})
}

// At the global limit a newcomer closes the oldest connection of the
// address that holds the most (the oldest of those, on a tie).
func TestUnauthenticatedEviction(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.MaxUnauthenticated = 4
		c.MaxUnauthenticatedPerSource = 3
	})
	open := func(from string) net.Conn {
		c := f.raw(t, from)
		if !versionLine(c) {
			t.Fatalf("a connection from %s refused", from)
		}
		return c
	}
	a1, a2, a3 := open("127.0.0.2"), open("127.0.0.2"), open("127.0.0.2")
	b1 := open("127.0.0.3")
	for i, want := range []net.Conn{a1, a2, a3, b1} { // a, then ties
		open(fmt.Sprintf("127.0.0.%d", 4+i))
		if !closedByServer(want) {
			t.Fatalf("newcomer %d: the expected connection was not closed", i)
		}
		if all, _ := f.srv.unauthenticated(""); all != 4 {
			t.Fatalf("newcomer %d: %d held", i, all)
		}
	}
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		if _, n := f.srv.unauthenticated(src); n != 0 {
			t.Fatalf("%s still holds %d", src, n)
		}
	}
}

func TestAuthFailuresPerSource(t *testing.T) {
	const max = 3
	f := newFixture(t, func(c *Config) {
		c.MaxAuthFailures = max
		c.AuthFailureBan = time.Second
	})
	fail := func(from string) {
		t.Helper()
		if _, err := f.dialFrom(t, from, "box", f.unregistered); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("unregistered key from %s: %v", from, err)
		}
	}
	refused := func(src string) bool {
		_, r := f.srv.fails.refused(src, time.Now())
		return r
	}
	login := func(from string) error {
		c, err := f.dialFrom(t, from, "box", f.alice)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, _, code := run(t, c, "exit 6"); code != 6 {
			return fmt.Errorf("exit %d", code)
		}
		return nil
	}
	for i := 0; i < max; i++ {
		fail("127.0.0.2")
	}
	fail("127.0.0.3") // one failure of another address
	testutil.WaitFor(t, "the expected state", func() bool { return refused("127.0.0.2") })
	// 127.0.0.2 is refused before the version line, whatever key it has.
	c := f.raw(t, "127.0.0.2")
	line, _ := io.ReadAll(io.LimitReader(c, 200))
	if !strings.HasPrefix(string(line), "den: too many failed authentications from this address (refused for ") {
		t.Fatalf("refused address got %q", line)
	}
	if err := login("127.0.0.2"); err == nil {
		t.Fatal("a refused address logged in")
	}
	// Other addresses are not: one with a failure of its own, one
	// without.
	for _, from := range []string{"127.0.0.1", "127.0.0.3"} {
		if err := login(from); err != nil {
			t.Fatalf("login from %s: %v", from, err)
		}
	}
	// A connection counts only if it tried a key and never got in:
	// neither a port scan nor a client that offers a wrong key before
	// the right one (as OpenSSH does with its agent's keys) counts.
	for i := 0; i < 2*max; i++ {
		f.raw(t, "127.0.0.4").Close()
		c, err := f.dialFrom(t, "127.0.0.5", "box", f.unregistered, f.alice)
		if err != nil {
			t.Fatalf("wrong key then right key: %v", err)
		}
		c.Close()
	}
	if f.srv.fails.size() != 2 || refused("127.0.0.4") || refused("127.0.0.5") {
		t.Fatalf("%d sources counted", f.srv.fails.size())
	}
	// The refusal ends.
	if !poll.Until(10*time.Second, func() bool { return login("127.0.0.2") == nil }) {
		t.Fatal("still refused after AuthFailureBan")
	}
}

// The failure table stays bounded however many addresses fail, keeps
// the addresses it refuses over those it only counts, and empties as
// its records expire.
func TestFailureTableBounded(t *testing.T) {
	const window, ban, maxSources = time.Minute, 5 * time.Minute, 100
	fl := newFailures(2, window, ban, maxSources)
	now := time.Unix(1e9, 0)
	src := func(i int) string { return fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255) }
	// Ten addresses refused, then 10,000 with one failure each.
	for i := 0; i < 10; i++ {
		fl.add(src(i), now)
		if !fl.add(src(i), now) {
			t.Fatalf("%s not refused at its 2nd failure", src(i))
		}
	}
	for i := 10; i < 10010; i++ {
		now = now.Add(time.Millisecond)
		fl.add(src(i), now)
		if n := fl.size(); n > maxSources {
			t.Fatalf("%d sources tracked", n)
		}
	}
	for i := 0; i < 10; i++ {
		if _, r := fl.refused(src(i), now); !r {
			t.Fatalf("%s no longer refused", src(i))
		}
	}
	if _, r := fl.refused(src(10005), now); r {
		t.Fatal("an address with one failure refused")
	}
	// Past the refusals and their windows, the table empties.
	now = now.Add(ban + window)
	fl.add("192.0.2.1", now)
	if n := fl.size(); n != 1 {
		t.Fatalf("%d sources tracked after they expired", n)
	}
	if _, r := fl.refused(src(0), now); r {
		t.Fatal("refused after the ban")
	}
}

// A flood of refused connections logs a bounded number of lines with
// the default rate limit, and sums up the rest.
func TestUnauthLogRateLimited(t *testing.T) {
	const summary = 100 * time.Millisecond
	logs := &testutil.Buffer{}
	f := newFixture(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.MaxUnauthenticatedPerSource = 1
		c.UnauthLogSummary = summary
	})
	if !versionLine(f.raw(t, "127.0.0.2")) { // holds the address's one slot
		t.Fatal("first connection refused")
	}
	const n = 1000
	start := time.Now()
	for i := 0; i < n; i++ {
		if !closedByServer(f.raw(t, "127.0.0.2")) {
			t.Fatalf("connection %d not refused", i)
		}
	}
	elapsed := time.Since(start)
	counted := func() (lines, logged, summed int) {
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			lines++
			switch {
			case strings.Contains(l, "msg=\"den: ssh gateway: refusing a connection\""):
				logged++
			case strings.Contains(l, "suppressed"):
				var c int
				if _, err := fmt.Sscanf(l[strings.Index(l, " count=")+1:], "count=%d", &c); err != nil {
					t.Fatalf("summary %q: %v", l, err)
				}
				summed += c
			}
		}
		return
	}
	// Every refusal is either logged or summed up.
	testutil.WaitFor(t, "the expected state", func() bool { _, logged, summed := counted(); return logged+summed == n })
	lines, logged, _ := counted()
	maxLogged := DefaultUnauthLogBurst + int(elapsed/DefaultUnauthLogEvery) + 1
	maxLines := maxLogged + int(elapsed/summary) + 2
	if logged > maxLogged || lines > maxLines || len(logs.String()) > maxLines*400 {
		t.Fatalf("%d refusals in %s: %d lines (%d logged), %d bytes; want at most %d lines",
			n, elapsed.Round(time.Millisecond), lines, logged, len(logs.String()), maxLines)
	}
	t.Logf("%d refusals in %s: %d lines (%d logged), %d bytes", n, elapsed.Round(time.Millisecond), lines, logged, len(logs.String()))
	if !strings.Contains(logs.String(), `x \"den: ssh gateway: refusing a connection\"`) {
		t.Fatalf("the summary does not say what it held back: %s", logs.String())
	}
	// A login is logged as ever.
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, "exit 0")
	c.Close()
	testutil.WaitFor(t, "the expected state", func() bool { return strings.Contains(logs.String(), "den: gateway session") })
}

func TestForwardCap(t *testing.T) {
	const max = 2
	f := newFixture(t, func(c *Config) { c.MaxChannels = 4; c.MaxForwards = max })
	c, err := f.dial("box", f.alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var fwds []net.Conn
	for i := 0; i < max; i++ {
		fw, err := c.Dial("tcp", "127.0.0.1:80")
		if err != nil {
			t.Fatalf("forward %d: %v", i, err)
		}
		fwds = append(fwds, fw)
	}
	for i := 0; i < 100; i++ {
		_, err := c.Dial("tcp", "127.0.0.1:80")
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || oce.Message != "den: too many forwards open on this connection (the limit is 2)" {
			t.Fatalf("forward over the cap: %v", err)
		}
	}
	// Sessions still have room ...
	if _, _, code := run(t, c, "exit 3"); code != 3 {
		t.Fatalf("session next to the forwards: %d", code)
	}
	// ... and a closed forward makes room for another.
	fwds[0].Close()
	testutil.WaitFor(t, "the expected state", func() bool {
		fw, err := c.Dial("tcp", "127.0.0.1:80")
		if err != nil {
			return false
		}
		fw.Close()
		return true
	})
	// Forwards to unix sockets are refused.
	_, err = c.Dial("unix", "/run/docker.sock")
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Message != streamlocalRefused {
		t.Fatalf("forward to a unix socket: %v", err)
	}
}

// -R (tcpip-forward, streamlocal-forward) is refused, and the client's
// session says why.
func TestRemoteForwardRefused(t *testing.T) {
	f := newFixture(t, nil)
	for _, remote := range []func(*gossh.Client) error{
		func(c *gossh.Client) error { _, err := c.Listen("tcp", "127.0.0.1:8080"); return err },
		func(c *gossh.Client) error { _, err := c.ListenUnix("/tmp/den.sock"); return err },
	} {
		c, err := f.dial("box", f.alice)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := c.NewSession() // open, no command yet
		if err != nil {
			t.Fatal(err)
		}
		stderr, err := s.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := remote(c); err == nil || !strings.Contains(err.Error(), "request denied by peer") {
			t.Fatalf("remote forward: %v", err)
		}
		line := make([]byte, len(remoteForwardRefused)+2)
		if _, err := io.ReadFull(stderr, line); err != nil || string(line) != remoteForwardRefused+"\r\n" {
			t.Fatalf("stderr: %q %v", line, err)
		}
		// Said once; the session and other global requests go on.
		if err := remote(c); err == nil {
			t.Fatal("second remote forward accepted")
		}
		if ok, _, err := c.SendRequest("keepalive@openssh.com", true, nil); ok || err != nil {
			t.Fatalf("keepalive: %v %v", ok, err)
		}
		var out bytes.Buffer
		s.Stdout = &out
		if err := s.Run("exit 0"); err != nil || out.String() != "out\n" {
			t.Fatalf("session after -R: %q %v", out.String(), err)
		}
	}
}
