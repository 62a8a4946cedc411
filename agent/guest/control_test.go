//go:build linux

package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/testutil"
	gossh "golang.org/x/crypto/ssh"
)

func TestReadyAndClock(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	ctx := testCtx(t)
	info, err := c.Ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != agent.Version || info.BootID == "" || info.Uptime <= 0 || info.Time.IsZero() {
		t.Errorf("ready: %+v", info)
	}
	if !strings.Contains(c.ServerVersion(), "denagent_") {
		t.Errorf("server version %q", c.ServerVersion())
	}
	want := time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC)
	rep, err := c.SetClock(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Step < 4*365*24*time.Hour {
		t.Errorf("clock step %v", rep.Step)
	}
	h.fake.mu.Lock()
	got := append([]time.Time(nil), h.fake.clock...)
	h.fake.mu.Unlock()
	if len(got) != 1 || !got[0].Equal(want) {
		t.Errorf("clock set to %v, want %v", got, want)
	}
	if _, err := c.SetClock(ctx, time.Unix(0, 0)); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("setting 1970: err %v", err)
	}
}

// TestReadySetsClock: a ready request that carries the host's time sets
// the guest clock in the same round trip (WaitReady with WithClockSet),
// and one that carries a time out of bounds says why it did not.
func TestReadySetsClock(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	dial := func(context.Context) (net.Conn, error) { return net.Dial("unix", h.sock) }
	before := time.Now()
	c, info, err := agent.WaitReady(ctx, dial, h.clientKey, agent.WithUser(h.user), agent.WithClockSet())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if info.Clock == nil || info.ClockError != "" {
		t.Fatalf("ready with a clock: clock %+v, error %q", info.Clock, info.ClockError)
	}
	h.fake.mu.Lock()
	got := append([]time.Time(nil), h.fake.clock...)
	h.fake.mu.Unlock()
	if len(got) != 1 || got[0].Before(before) || got[0].After(time.Now()) {
		t.Fatalf("clock set to %v, want one time between %v and now", got, before)
	}
	// Without the option, or from an older den ("{}"), nothing is set.
	c = h.dial()
	if info, err := c.Ready(ctx); err != nil || info.Clock != nil || info.ClockError != "" {
		t.Fatalf("plain ready: %+v %v", info, err)
	}
	ok, payload, err := c.SSH().SendRequest(agent.ReqReady, true, []byte(`{"clock_unix_nano":1}`))
	if err != nil || !ok || !strings.Contains(string(payload), `"clock_error":"clock: refusing`) {
		t.Fatalf("ready with a clock in 1970: %v %s %v", ok, payload, err)
	}
	h.fake.mu.Lock()
	n := len(h.fake.clock)
	h.fake.mu.Unlock()
	if n != 1 {
		t.Fatalf("the clock was set %d times, want 1", n)
	}
}

// TestReadyGivesIdentity: a ready request with an identity sets the clock,
// then gives the guest its new identity, in one round trip; a bad one is
// refused in the answer, the connection kept.
func TestReadyGivesIdentity(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	dial := func(context.Context) (net.Conn, error) { return net.Dial("unix", h.sock) }
	c, info, err := agent.WaitReady(ctx, dial, h.clientKey, agent.WithUser(h.user), agent.WithClockSet(),
		agent.WithIdentity(agent.IdentityRequest{Hostname: "fork-9", MachineID: strings.Repeat("ab", 16)}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info.Clock == nil || info.Identity == nil || info.IdentityError != "" {
		t.Fatalf("ready with a clock and an identity: clock %+v, identity %+v, error %q", info.Clock, info.Identity, info.IdentityError)
	}
	if info.Identity.Hostname != "fork-9" || info.Identity.MachineID != strings.Repeat("ab", 16) || len(info.Identity.Steps) == 0 {
		t.Fatalf("identity answer %+v", info.Identity)
	}
	var cpu float64
	for _, s := range info.Identity.Steps {
		cpu += s.CPUMS
	}
	if cpu <= 0 {
		t.Fatalf("the identity's steps report no cpu time of the agent: %+v", info.Identity.Steps)
	}
	if data, err := os.ReadFile(filepath.Join(h.etc, "machine-id")); err != nil || string(data) != strings.Repeat("ab", 16)+"\n" {
		t.Fatalf("machine-id %q %v", data, err)
	}
	h.fake.mu.Lock()
	hosts := append([]string(nil), h.fake.hostname...)
	h.fake.mu.Unlock()
	if len(hosts) != 1 || hosts[0] != "fork-9" {
		t.Fatalf("hostnames set %v, want [fork-9]", hosts)
	}
	ok, payload, err := c.SSH().SendRequest(agent.ReqReady, true, []byte(`{"identity":{"hostname":"bad name","entropy":"AAAA"}}`))
	if err != nil || !ok || !strings.Contains(string(payload), `"identity_error":"identity: need at least`) {
		t.Fatalf("ready with a bad identity: %v %s %v", ok, payload, err)
	}
	if _, err := c.Ready(ctx); err != nil {
		t.Fatalf("the connection after a refused identity: %v", err)
	}
}

func TestFreezeThaw(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	ctx := testCtx(t)
	rep, err := c.Freeze(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/data/sub", "/data", "/"}; !reflect.DeepEqual(rep.Frozen, want) {
		t.Errorf("frozen %v, want %v (deepest first)", rep.Frozen, want)
	}
	if info, _ := c.Ready(ctx); !info.Frozen {
		t.Error("ready does not report frozen")
	}
	if _, err := c.NewIdentity(ctx, "x"); err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Errorf("identity while frozen: %v", err)
	}
	th, err := c.Thaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/", "/data", "/data/sub"}; !reflect.DeepEqual(th.Thawed, want) {
		t.Errorf("thawed %v, want %v", th.Thawed, want)
	}

	// The agent thaws by itself after the timeout...
	if _, err := c.Freeze(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, 5*time.Second, "thaw after timeout", func() bool { f, _ := h.fake.snapshot(); return len(f) == 0 })

	// ...and when the connection that froze goes away.
	c2 := h.dial()
	if _, err := c2.Freeze(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	testutil.WaitForWithin(t, 5*time.Second, "thaw after disconnect", func() bool { f, _ := h.fake.snapshot(); return len(f) == 0 })

	// A failure part way thaws what was frozen.
	h.fake.mu.Lock()
	h.fake.failOn = "/data"
	h.fake.mu.Unlock()
	if _, err := c.Freeze(ctx, time.Minute); err == nil || !strings.Contains(err.Error(), "fake freeze failure") {
		t.Errorf("freeze failure: %v", err)
	}
	if f, _ := h.fake.snapshot(); len(f) != 0 {
		t.Errorf("still frozen after a failed freeze: %v", f)
	}
}

func TestNewIdentity(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	old, _ := os.Hostname()
	writeFile(t, filepath.Join(h.etc, "hosts"), "127.0.0.1\tlocalhost\n127.0.1.1\t"+old+"\n")
	rep, err := c.NewIdentity(testCtx(t), "fork-2")
	if err != nil {
		t.Fatal(err)
	}
	h.fake.mu.Lock()
	entropy, hostnames := h.fake.entropy, h.fake.hostname
	h.fake.mu.Unlock()
	if len(entropy) != 1 || len(entropy[0]) < agent.MinEntropy || !reflect.DeepEqual(hostnames, []string{"fork-2"}) {
		t.Errorf("reseed %d times, hostnames %v", len(entropy), hostnames)
	}
	mid, _ := os.ReadFile(filepath.Join(h.etc, "machine-id"))
	if rep.MachineID == "" || string(mid) != rep.MachineID+"\n" || !validMachineID(rep.MachineID) {
		t.Errorf("machine-id %q, reply %q", mid, rep.MachineID)
	}
	hn, _ := os.ReadFile(filepath.Join(h.etc, "hostname"))
	hosts, _ := os.ReadFile(filepath.Join(h.etc, "hosts"))
	if string(hn) != "fork-2\n" || !strings.Contains(string(hosts), "127.0.1.1\tfork-2") {
		t.Errorf("hostname file %q, hosts %q", hn, hosts)
	}
	rep2, err := c.NewIdentity(testCtx(t), "")
	if err != nil || rep2.MachineID == rep.MachineID {
		t.Errorf("second identity: %v, same machine id %v", err, rep2.MachineID == rep.MachineID)
	}
	if _, err := c.NewIdentity(testCtx(t), "bad_host!"); err == nil {
		t.Error("invalid hostname accepted")
	}
}

func TestPoweroffRequest(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	if err := c.Poweroff(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, 5*time.Second, "poweroff", func() bool {
		h.fake.mu.Lock()
		defer h.fake.mu.Unlock()
		return len(h.fake.poweroff) == 1 && !h.fake.poweroff[0]
	})
}

func TestWrongKeyRefused(t *testing.T) {
	h := newHarness(t)
	_, other, _ := agent.NewEd25519Key("intruder")
	if c, err := h.dialWith(other); err == nil {
		c.Close()
		t.Fatal("a key that is not authorized got in")
	} else if !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("unexpected error: %v", err)
	}
}

func TestHostKeyPinning(t *testing.T) {
	h := newHarness(t)
	var recorded []byte
	c, err := h.dialWith(h.clientKey, agent.WithHostKeyCallback(agent.PinnedHostKey(nil, func(k gossh.PublicKey) error {
		recorded = k.Marshal()
		return nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if !bytes.Equal(recorded, h.hostKey.PublicKey().Marshal()) {
		t.Error("trust on first use did not record the agent's key")
	}
	_, other, _ := agent.NewEd25519Key("other")
	if c, err := h.dialWith(h.clientKey, agent.WithHostKeyCallback(agent.PinnedHostKey(other.PublicKey(), nil))); err == nil {
		c.Close()
		t.Fatal("a wrong pinned host key was accepted")
	}
}

func TestSFTP(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	sc, err := c.SFTP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	sum := sha256.Sum256(data)
	remote := filepath.Join(t.TempDir(), "blob")
	f, err := sc.Create(remote)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	local, _ := os.ReadFile(remote)
	if sha256.Sum256(local) != sum {
		t.Fatal("put: checksum mismatch")
	}
	g, err := sc.Open(remote)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(g)
	g.Close()
	if err != nil || sha256.Sum256(got) != sum {
		t.Fatalf("get: %v, checksum match %v", err, sha256.Sum256(got) == sum)
	}
	if wd, err := sc.Getwd(); err != nil || wd != h.home {
		t.Errorf("sftp working directory %q (%v), want home %q", wd, err, h.home)
	}
}

func TestDirectTCPIP(t *testing.T) {
	h := newHarness(t)
	c := h.dial()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b, _ := io.ReadAll(conn)
				conn.Write(bytes.ToUpper(b))
			}()
		}
	}()
	conn, err := c.DialTCP(testCtx(t), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, 5*time.Second, "forward counted", func() bool {
		a, err := c.Activity(testCtx(t))
		return err == nil && a.Forwards == 1 && a.TCPEstablished >= 2
	})
	conn.Write([]byte("ping through the guest"))
	conn.(interface{ CloseWrite() error }).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || string(got) != "PING THROUGH THE GUEST" {
		t.Fatalf("echo: %q %v", got, err)
	}
	testutil.WaitForWithin(t, 5*time.Second, "forward closed", func() bool {
		a, err := c.Activity(testCtx(t))
		return err == nil && a.Forwards == 0
	})
	if _, err := c.DialTCP(testCtx(t), "127.0.0.1:1"); err == nil {
		t.Error("dial to a closed port succeeded")
	}
}
