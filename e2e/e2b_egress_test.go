package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestE2BEgress: the network settings of an E2B create, enforced. A
// daemon with TAP networking (den's egress policy is nftables there) and
// --e2b-listen runs in the test network's den namespace
// (startNetDaemon), three HTTP servers, A, B and C, in its wan namespace
// (A and B in 10.99.1.0/24, C not).
// e2e/e2bsdk/egress.mjs, run with the official SDK in the den namespace
// (where the E2B listener is), makes sandboxes and connects from inside
// each: allowInternetAccess false reaches neither server (also after
// pause and connect); network allowOut [B] with denyOut [ALL_TRAFFIC]
// reaches B and not A, and so does its fork; denyOut [10.99.1.0/24] with
// allowOut [B] (den's deny list with an exception) reaches C and B, not
// A; a denyOut of a domain is refused at create. Then the servers' logs
// say no blocked request arrived, and den net log shows each sandbox's
// policy and its dropped packets.
// wanDeny holds wanHostA and wanHostB, not wanAddr.
const wanDeny = "10.99.1.0/24"

func TestE2BEgress(t *testing.T) {
	node, sdkDir := e2bSDK(t)
	n := newTestNet(t)
	// Each server logs the paths asked for: /SANDBOX/TAG.
	var mu sync.Mutex
	seen := map[string][]string{}
	for _, addr := range []string{wanHostA, wanHostB, wanAddr} {
		addr := addr
		n.serveHTTP(n.wan, addr+":80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen[addr] = append(seen[addr], r.URL.Path)
			mu.Unlock()
			fmt.Fprintf(w, "this is %s\n", addr)
		}))
	}
	d := startNetDaemon(t, n, "--e2b-listen", "127.0.0.1:0")
	// The address is the den namespace's loopback: the SDK runs there.
	e2bURL := e2bAddr(t, d)
	key := strings.TrimSpace(d.must("tokens", "add", "--user", "den-e2b-egress", "sdk"))

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", n.den, node, "egress.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+e2bURL, "E2B_SANDBOX_URL="+e2bURL, "E2B_API_KEY="+key,
		"DEN_E2B_TEMPLATE=debian", "DEN_E2B_HOST_A="+wanHostA, "DEN_E2B_HOST_B="+wanHostB, "DEN_E2B_HOST_C="+wanAddr,
		"DEN_E2B_DENY="+wanDeny)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("the SDK program (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		log, _ := os.ReadFile(d.logPath)
		t.Fatalf("the SDK program: %v\ndaemon log:\n%s", err, log)
	}
	var ids struct{ Closed, Listed, Denied, Forked string }
	last := out.String()[strings.LastIndex(out.String(), "RESULT ")+len("RESULT "):]
	if err := json.Unmarshal([]byte(last), &ids); err != nil || ids.Closed == "" || ids.Listed == "" || ids.Denied == "" || ids.Forked == "" {
		t.Fatalf("no RESULT line with the sandboxes: %v %+v", err, ids)
	}

	// The servers' side: what got through, by sandbox.
	mu.Lock()
	got := map[string]string{}
	for addr, paths := range seen {
		got[addr] = strings.Join(paths, " ")
	}
	mu.Unlock()
	for _, c := range []struct {
		addr, sandbox string
		want          bool
	}{
		{wanHostA, ids.Denied, false}, {wanHostB, ids.Denied, true}, {wanAddr, ids.Denied, true},
		{wanHostA, ids.Closed, false}, {wanHostB, ids.Closed, false},
		{wanHostA, ids.Listed, false}, {wanHostB, ids.Listed, true},
		{wanHostA, ids.Forked, false}, {wanHostB, ids.Forked, true},
	} {
		if strings.Contains(got[c.addr], "/"+c.sandbox+"/") != c.want {
			t.Errorf("server %s saw %q; a request of %s: want %v", c.addr, got[c.addr], c.sandbox, c.want)
		}
	}

	// den's view: each sandbox's policy, and what it dropped.
	type denied struct {
		Addr string `json:"addr"`
		Port int    `json:"port"`
	}
	var logs = map[string]struct {
		Egress        string   `json:"egress"`
		DeniedPackets uint64   `json:"denied_packets"`
		Denied        []denied `json:"denied"`
	}{}
	all := []string{ids.Closed, ids.Listed, ids.Denied, ids.Forked}
	for _, id := range all {
		l := logs[id]
		if err := json.Unmarshal([]byte(d.must("net", "log", id, "--json")), &l); err != nil {
			t.Fatal(err)
		}
		logs[id] = l
		t.Logf("den net log %s:\n%s", id, d.must("net", "log", id))
	}
	for _, c := range []struct {
		id, egress string
		blocked    []string // addresses whose port 80 must be among the drops
	}{
		{ids.Closed, "deny-all", []string{wanHostA, wanHostB}},
		{ids.Listed, "allow:" + wanHostB, []string{wanHostA}},
		{ids.Denied, "deny:" + wanDeny + ";allow:" + wanHostB, []string{wanHostA}},
		{ids.Forked, "allow:" + wanHostB, []string{wanHostA}},
	} {
		l := logs[c.id]
		if l.Egress != c.egress {
			t.Errorf("%s: egress %q, want %q", c.id, l.Egress, c.egress)
		}
		drops := map[string]bool{}
		for _, dn := range l.Denied {
			drops[fmt.Sprintf("%s:%d", dn.Addr, dn.Port)] = true
		}
		for _, addr := range []string{wanHostA, wanHostB} {
			want := strings.Contains(strings.Join(c.blocked, " "), addr)
			if drops[addr+":80"] != want {
				t.Errorf("%s (%s): a drop to %s:80 in den net log is %v, want %v: %+v", c.id, c.egress, addr, drops[addr+":80"], want, l.Denied)
			}
		}
		// (Only the blocked need drops: a guest may knock elsewhere.)
		if len(c.blocked) > 0 && l.DeniedPackets == 0 {
			t.Errorf("%s (%s): %d denied packets", c.id, c.egress, l.DeniedPackets)
		}
	}
	for _, id := range all {
		d.must("rm", "--force", id)
	}
}
