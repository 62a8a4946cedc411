package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/netns"
)

// netVM is what the network tests read of a VM.
type netVM struct {
	Name    string `json:"name"`
	State   string `json:"state"`
	Network string `json:"network"`
	IP      string `json:"ip"`
	Egress  string `json:"egress"`
}

func (d *daemon) netInfo(name string) netVM {
	d.t.Helper()
	var vm netVM
	if err := json.Unmarshal([]byte(d.must("info", name, "--json")), &vm); err != nil {
		d.t.Fatal(err)
	}
	return vm
}

// fetch runs wget in a VM (bounded by 30 s, for a loaded host): the
// body, or an error.
func (d *daemon) fetch(vm, url string) (string, error) {
	return d.run("exec", vm, "--", "sh", "-c", "timeout 30 wget -q -O - "+url)
}

// blocked says whether a fetch that should not get through does not
// (within 6 s: a dropped SYN only times out).
func (d *daemon) blocked(vm, url string) (string, bool) {
	out, err := d.run("exec", vm, "--", "sh", "-c", "timeout 6 wget -q -O - "+url)
	return out, err != nil
}

// guestAddr is the VM's own view of eth0: its MAC and IPv4 address.
func (d *daemon) guestAddr(vm string) (mac, ip string) {
	out := d.must("exec", vm, "--", "sh", "-c", "cat /sys/class/net/eth0/address; ip -4 -o addr show eth0")
	lines := strings.SplitN(out, "\n", 2)
	mac = strings.TrimSpace(lines[0])
	if f := strings.Fields(lines[1]); len(f) >= 4 {
		ip = f[3]
	}
	return mac, ip
}

// startNetDaemon starts a daemon with TAP networking in the test
// network's den namespace, its resolver asking the wan's DNS server and
// VM URLs on 127.0.0.1:8081 there.
func startNetDaemon(t *testing.T, n *testNet, extra ...string) *daemon {
	return startDaemonIn(t, func(string) []string {
		return append([]string{"--net", "tap", "--netns", n.den, "--dns-upstream", wanAddr,
			"--http-listen", "127.0.0.1:8081"}, extra...)
	})
}

// TestNetwork: two QEMU guests on TAPs of their own, NAT to a server
// outside, isolated from each other and from the host's services, with
// the same address after sleep, restore and a daemon restart; a fork gets
// its own; nothing is left of a removed VM, also after kill -9.
func TestNetwork(t *testing.T) {
	n := newTestNet(t)
	n.serveHTTP(n.wan, wanAddr+":80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from wan, you are %s\n", strings.Split(r.RemoteAddr, ":")[0])
	}))
	// The host's own service, in the daemon's namespace: no VM may reach it.
	n.serveHTTP(n.den, "0.0.0.0:9999", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "host secret")
	}))
	d := startNetDaemon(t, n)
	d.must("create", "a", "--memory", "256M")
	d.must("create", "b", "--memory", "256M")
	a, b := d.netInfo("a"), d.netInfo("b")
	if a.Network != "tap" || b.Network != "tap" || a.IP == "" || a.IP == b.IP {
		t.Fatalf("want two VMs on taps with their own addresses: %+v %+v", a, b)
	}
	for _, vm := range []string{"a", "b"} {
		out, err := d.fetch(vm, "http://"+wanAddr+"/")
		if err != nil || out != "hello from wan, you are "+denUplink+"\n" {
			t.Fatalf("%s fetching from the wan server (NAT'd to %s): %q %v", vm, denUplink, out, err)
		}
		if _, ip := d.guestAddr(vm); ip != d.netInfo(vm).IP {
			t.Fatalf("%s: the guest has %s, den says %s", vm, ip, d.netInfo(vm).IP)
		}
	}
	t.Logf("a %s, b %s", a.IP, b.IP)

	// Isolation: b serves on 8080; a cannot reach it, nor the host's
	// service (by the uplink address, nor by its own gateway's).
	d.must("exec", "b", "--", "sh", "-c", "mkdir -p /tmp/www && echo hi from b > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	bIP := strings.Split(b.IP, "/")[0]
	aGW := gateway(a.IP)
	for _, url := range []string{"http://" + bIP + ":8080/", "http://" + denUplink + ":9999/", "http://" + aGW + ":9999/"} {
		if out, ok := d.blocked("a", url); !ok {
			t.Fatalf("a reached %s: %q", url, out)
		}
	}
	if out, err := d.fetch("b", "http://127.0.0.1:8080/"); err != nil || out != "hi from b\n" {
		t.Fatalf("b's own server: %q %v", out, err)
	}
	// den net log shows what was dropped, whatever dropped it: the
	// other VM and the host's services, not only the egress policy.
	var log struct {
		DeniedPackets uint64 `json:"denied_packets"`
		Denied        []struct {
			Addr string `json:"addr"`
			Port int    `json:"port"`
		} `json:"denied"`
	}
	if err := json.Unmarshal([]byte(d.must("net", "log", "a", "--json")), &log); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{bIP + ":8080", denUplink + ":9999", aGW + ":9999"} {
		found := false
		for _, dn := range log.Denied {
			found = found || fmt.Sprintf("%s:%d", dn.Addr, dn.Port) == want
		}
		if !found || log.DeniedPackets < 3 {
			t.Errorf("den net log a: %s not among what was dropped (%d packets): %+v", want, log.DeniedPackets, log.Denied)
		}
	}

	reach := func(when string) {
		t.Helper()
		if vm := d.netInfo("a"); vm.IP != a.IP {
			t.Fatalf("after %s a has %s, had %s", when, vm.IP, a.IP)
		}
		if out, err := d.fetch("a", "http://"+wanAddr+"/"); err != nil || !strings.HasPrefix(out, "hello from wan") {
			t.Fatalf("after %s a cannot reach the wan server: %q %v", when, out, err)
		}
		if _, ip := d.guestAddr("a"); ip != a.IP {
			t.Fatalf("after %s the guest has %s, want %s", when, ip, a.IP)
		}
	}
	d.must("checkpoint", "a")
	d.must("sleep", "a")
	reach("sleep and wake")
	d.must("restore", "a", "cp-1")
	// The new QEMU started beside the old one, sharing its TAP
	// (machine/prelaunch.go), and took over once it was gone.
	if s := d.steps("a"); !strings.Contains(s, "take the prelaunched vmm") || strings.Contains(s, "qemu: launch") {
		t.Fatalf("the restore did not take a prelaunched vmm: %s", s)
	}
	reach("restore")
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	d.waitExit()
	d.start()
	reach("a daemon restart")
	// A reboot: the VM was put to sleep, then the host lost its TAPs.
	aTap := tapOf(t, d, "a")
	d.must("sleep", "a")
	d.kill()
	n.ip(n.den, "link", "del", aTap)
	d.start()
	reach("a reboot (its tap gone while it slept)")

	// A fork has its own MAC and address, and the network works there.
	d.must("fork", "a", "c")
	c := d.netInfo("c")
	aMAC, _ := d.guestAddr("a")
	cMAC, cIP := d.guestAddr("c")
	if c.IP == a.IP || c.IP == b.IP || cIP != c.IP || cMAC == aMAC {
		t.Fatalf("fork: a %s %s, c %s (guest %s) %s", a.IP, aMAC, c.IP, cIP, cMAC)
	}
	if out, err := d.fetch("c", "http://"+wanAddr+"/"); err != nil || !strings.HasPrefix(out, "hello from wan") {
		t.Fatalf("the fork cannot reach the wan server: %q %v", out, err)
	}
	if out, err := d.fetch("a", "http://"+wanAddr+"/"); err != nil || !strings.HasPrefix(out, "hello from wan") {
		t.Fatalf("a lost its network to its fork: %q %v", out, err)
	}

	// Removal leaves nothing, and neither does a kill -9 with a VM
	// removed meanwhile (its TAP left behind is taken away at start).
	taps := func() string { return n.ip(n.den, "-o", "link", "show", "type", "tun") }
	cTap := tapOf(t, d, "c")
	d.must("rm", "c")
	if strings.Contains(taps(), cTap) || strings.Contains(n.nft(n.den), `"`+cTap+`"`) {
		t.Fatalf("tap %s of the removed vm is left:\n%s\n%s", cTap, taps(), n.nft(n.den))
	}
	bTap := tapOf(t, d, "b")
	d.kill()
	// b is removed while no daemon runs: its record goes, its tap stays.
	d.env = append(d.env, "DEN_CRASHPOINT=rm-after-mark")
	d.start()
	if _, err := d.run("rm", "b"); err == nil {
		t.Fatal("rm at its crash point succeeded")
	}
	d.waitExit()
	d.env = nil
	n.ip(n.den, "tuntap", "add", "dev", strings.Split(bTap, "-")[0]+"-999", "mode", "tap") // a tap nobody owns
	d.start()
	if !eventually(30*time.Second, func() bool { return !strings.Contains(taps(), bTap) && !strings.Contains(taps(), "-999") }) {
		t.Fatalf("taps left after a restart:\n%s", taps())
	}
	rules := n.nft(n.den)
	if strings.Contains(rules, `"`+bTap+`"`) || len(regexp.MustCompile(`chain vm_[0-9]+ `).FindAllString(rules, -1)) != 1 {
		t.Fatalf("rules of removed vms are left:\n%s", rules)
	}
	reach("a crash and a restart")
}

// gateway is the host side of a VM's /30 (its address minus one).
func gateway(cidr string) string {
	ip := strings.Split(cidr, "/")[0]
	p := strings.Split(ip, ".")
	var last int
	fmt.Sscan(p[3], &last)
	return fmt.Sprintf("%s.%s.%s.%d", p[0], p[1], p[2], last-1)
}

// tapOf is a VM's TAP device.
func tapOf(t *testing.T, d *daemon, vm string) string {
	t.Helper()
	var n struct {
		Tap string `json:"tap"`
	}
	if err := json.Unmarshal([]byte(d.must("net", "log", vm, "--json")), &n); err != nil || n.Tap == "" {
		t.Fatalf("net log %s: %v %+v", vm, err, n)
	}
	return n.Tap
}

// TestEgress: deny-all blocks and counts; an allow-list admits a name the
// (test's) DNS serves, refuses others, and drops a direct connection to
// an address no allowed name resolved to; a live change takes effect
// without restarting the VM.
func TestEgress(t *testing.T) {
	n := newTestNet(t)
	for _, addr := range []string{wanHostA, wanHostB} {
		addr := addr
		n.serveHTTP(n.wan, addr+":80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "this is %s\n", addr)
		}))
	}
	n.serveDNS(n.wan, wanAddr, map[string]string{"allowed.test": wanHostA, "other.test": wanHostB})
	d := startNetDaemon(t, n)
	d.must("create", "box", "--memory", "256M", "--egress", "deny-all")
	if vm := d.netInfo("box"); vm.Egress != "deny-all" {
		t.Fatalf("egress %q, want deny-all", vm.Egress)
	}
	if out, ok := d.blocked("box", "http://"+wanHostA+"/"); !ok {
		t.Fatalf("deny-all let a connection through: %q", out)
	}
	var log struct {
		DeniedPackets uint64 `json:"denied_packets"`
		Denied        []struct {
			Addr string `json:"addr"`
			Port int    `json:"port"`
		} `json:"denied"`
		RefusedNames []string `json:"refused_names"`
	}
	readLog := func() {
		t.Helper()
		if err := json.Unmarshal([]byte(d.must("net", "log", "box", "--json")), &log); err != nil {
			t.Fatal(err)
		}
	}
	readLog()
	if log.DeniedPackets == 0 || len(log.Denied) == 0 || log.Denied[0].Addr != wanHostA || log.Denied[0].Port != 80 {
		t.Fatalf("deny-all's drops are not in den net log: %+v", log)
	}
	t.Logf("den net log box:\n%s", d.must("net", "log", "box"))

	d.must("net", "policy", "box", "allow:allowed.test")
	// An address before any allowed name resolved to it: dropped.
	if out, ok := d.blocked("box", "http://"+wanHostA+"/"); !ok {
		t.Fatalf("a direct connection to an unresolved address went through: %q", out)
	}
	if out, err := d.fetch("box", "http://allowed.test/"); err != nil || out != "this is "+wanHostA+"\n" {
		t.Fatalf("allowed.test: %q %v", out, err)
	}
	// The connection is in the VM's activity record: its address, the
	// name den's resolver answered for it, the process and its session.
	var conns []struct{ Addr, Proto, Name, Comm, Session string }
	out := d.must("activity", "box", "--net", "--json")
	if err := json.Unmarshal([]byte(out), &conns); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(conns, func(c struct{ Addr, Proto, Name, Comm, Session string }) bool {
		return c.Addr == wanHostA+":80" && c.Proto == "tcp" && c.Name == "allowed.test" && c.Comm == "wget" && strings.HasPrefix(c.Session, "den-")
	}) {
		t.Fatalf("the connection to allowed.test is not in den activity box --net:\n%s", out)
	}
	t.Logf("den activity box --net:\n%s", d.must("activity", "box", "--net"))
	// What the resolver let through survives a daemon restart (the table
	// is made anew): the address answers without a new lookup.
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	d.waitExit()
	d.start()
	if out, err := d.fetch("box", "http://"+wanHostA+"/"); err != nil || out != "this is "+wanHostA+"\n" {
		t.Fatalf("allowed.test's address after a daemon restart: %q %v", out, err)
	}
	out, err := d.run("exec", "box", "--", "sh", "-c", "nslookup other.test")
	if err == nil || strings.Contains(out, wanHostB) {
		t.Fatalf("other.test resolved under allow:allowed.test: %q %v", out, err)
	}
	if out, ok := d.blocked("box", "http://"+wanHostB+"/"); !ok {
		t.Fatalf("a direct connection to other.test's address went through: %q", out)
	}
	readLog()
	if !strings.Contains(strings.Join(log.RefusedNames, " "), "other.test") {
		t.Fatalf("the refused name is not in den net log: %+v", log)
	}

	// A live change, without restarting the VM: its process survives.
	d.must("exec", "box", "--", "sh", "-c", "sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/pid")
	d.must("net", "policy", "box", "allow:allowed.test,*.test")
	if out, err := d.fetch("box", "http://other.test/"); err != nil || out != "this is "+wanHostB+"\n" {
		t.Fatalf("other.test after the policy change: %q %v", out, err)
	}
	d.must("exec", "box", "--", "sh", "-c", "kill -0 $(cat /tmp/pid)")
	// A deny list: what it lists is closed, the rest open; the names of
	// its allow list open their addresses even inside it.
	d.must("net", "policy", "box", "deny:"+wanHostA)
	if out, err := d.fetch("box", "http://other.test/"); err != nil || out != "this is "+wanHostB+"\n" {
		t.Fatalf("other.test under deny:%s: %q %v", wanHostA, out, err)
	}
	if out, ok := d.blocked("box", "http://"+wanHostA+"/"); !ok {
		t.Fatalf("deny:%s let a connection to it through: %q", wanHostA, out)
	}
	d.must("net", "policy", "box", "deny:10.99.1.0/24;allow:allowed.test")
	if out, ok := d.blocked("box", "http://"+wanHostA+"/"); !ok {
		t.Fatalf("a denied address before its listed name resolved went through: %q", out)
	}
	if out, err := d.fetch("box", "http://allowed.test/"); err != nil || out != "this is "+wanHostA+"\n" {
		t.Fatalf("allowed.test, the deny list's exception: %q %v", out, err)
	}
	if out, ok := d.blocked("box", "http://other.test/"); !ok {
		t.Fatalf("other.test, in the deny list and not an exception, went through: %q", out)
	}
	if vm := d.netInfo("box"); vm.Egress != "deny:10.99.1.0/24;allow:allowed.test" {
		t.Fatalf("egress %q after den net policy deny:...", vm.Egress)
	}
	d.must("net", "policy", "box", "allow:"+wanHostB)
	if out, err := d.fetch("box", "http://"+wanHostB+"/"); err != nil {
		t.Fatalf("a CIDR entry: %q %v", out, err)
	}
	if out, ok := d.blocked("box", "http://"+wanHostA+"/"); !ok {
		t.Fatalf("an address out of the new list went through: %q", out)
	}

	// Bad input: one line each, non-zero, nothing changed.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"net", "policy", "box", "allow:"}, "the list is empty"},
		{[]string{"net", "policy", "box", "allow:ex ample.com"}, "bad egress entry"},
		{[]string{"net", "policy", "box", "allow:10.0.0.1/8"}, "10.0.0.0/8"},
		{[]string{"net", "policy", "box", "permit-all"}, "bad egress policy"},
		{[]string{"net", "policy", "box", "deny:other.test"}, "a deny list takes IPv4 addresses and CIDRs"},
		{[]string{"create", "x", "--egress", "allow:*"}, "bad egress entry"},
		{[]string{"url", "box", "--port", "70000"}, "1 to 65535"},
	} {
		out, err := d.run(c.args...)
		if err == nil || !strings.Contains(stderrOf(err), c.want) || strings.Count(strings.TrimSpace(stderrOf(err)), "\n") != 0 {
			t.Errorf("den %s: %q %v, want one line with %q", strings.Join(c.args, " "), out, err, c.want)
		}
	}
	if vm := d.netInfo("box"); vm.Egress != "allow:"+wanHostB {
		t.Fatalf("a refused change changed the policy: %q", vm.Egress)
	}

	// A second daemon whose pool the first one's VMs use, and malformed
	// pools: refused with one line, before anything is mounted.
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--netns", n.den, "--net", "tap"}, "network pool 10.200.0.0/16 overlaps route 10.200.0.0/30 on dn"},
		{[]string{"--net-pool", "10.200.0.0/33"}, "bad network pool"},
		{[]string{"--net-pool", "10.200.0.1/16"}, "use 10.200.0.0/16"},
		{[]string{"--dns-upstream", "resolver.example"}, "bad resolver"},
		{[]string{"--egress-default", "allow:bad..name"}, "bad egress entry"},
	} {
		args := append([]string{"daemon", "--state-dir", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "den.sock"),
			"--images", d.images.Path(), "--ssh-listen", "off"}, c.args...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, d.den, args...).CombinedOutput()
		cancel()
		line := strings.TrimSpace(string(out))
		if err == nil || !strings.Contains(line, c.want) || strings.Contains(line, "\n") {
			t.Errorf("den daemon %s: %v\n%s\nwant one line with %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
	if out, _ := exec.Command("mount").Output(); strings.Contains(string(out), dir) {
		t.Fatalf("a refused daemon left a mount:\n%s", out)
	}
}

// TestVMURL: a VM's port through --http-listen, private by its token;
// a request wakes a sleeping VM; a VM with a streaming response open
// stays awake past its idle timeout.
func TestVMURL(t *testing.T) {
	n := newTestNet(t)
	d := startNetDaemon(t, n)
	d.must("create", "web", "--memory", "256M", "--idle-timeout", "3s")
	d.must("exec", "web", "--", "sh", "-c", "mkdir -p /tmp/www/cgi-bin && echo hi from web > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	var u struct {
		URL   string `json:"url"`
		Token string `json:"token"`
		Port  int    `json:"port"`
	}
	if err := json.Unmarshal([]byte(d.must("url", "web", "--json")), &u); err != nil || u.Token == "" || u.Port != 8080 {
		t.Fatalf("den url: %v %+v", err, u)
	}
	hc := n.client(n.den)
	get := func(url string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// A browser: the token in the URL sets a cookie and is redirected
	// out of the address bar.
	browser := n.client(n.den)
	browser.Jar, _ = cookiejar.New(nil)
	if resp, err := browser.Get(u.URL); err != nil {
		t.Fatalf("GET %s: %v", u.URL, err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "hi from web\n" || strings.Contains(resp.Request.URL.String(), "den_token") {
			t.Fatalf("GET %s: %d %q at %s", u.URL, resp.StatusCode, body, resp.Request.URL)
		}
	}
	base := "http://127.0.0.1:8081/vm/web/"
	if code, body := get(base, "Authorization", "Bearer "+u.Token); code != 200 || body != "hi from web\n" {
		t.Fatalf("bearer: %d %q", code, body)
	}
	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong"}} {
		if code, _ := get(base, h...); code != 401 {
			t.Fatalf("without the token (%v): %d, want 401", h, code)
		}
	}
	if code, _ := get("http://127.0.0.1:8081/vm/nosuchvm/"); code != 401 {
		t.Fatalf("an unknown vm: %d, want 401 like a wrong token", code)
	}

	// A sleeping VM is woken by a request, its server still there.
	if !eventually(2*time.Minute, func() bool { return d.netInfo("web").State == "sleeping" }) {
		t.Fatalf("web did not fall asleep after its idle timeout: %+v", d.netInfo("web"))
	}
	start := time.Now()
	if code, body := get(base, "Authorization", "Bearer "+u.Token); code != 200 || body != "hi from web\n" {
		t.Fatalf("a request to the sleeping vm: %d %q", code, body)
	}
	t.Logf("request to a sleeping vm answered in %s", time.Since(start).Round(time.Millisecond))
	// The requests through its URL are in its activity record (those
	// within 10 s of each other share an entry).
	var es []api.ActivityEntry
	if err := json.Unmarshal([]byte(d.must("activity", "web", "--sessions", "--json")), &es); err != nil {
		t.Fatal(err)
	}
	if n := len(es); n == 0 || es[n-1].Via != "url" || !strings.HasPrefix(es[n-1].Detail, "to port 8080") {
		t.Errorf("url requests in the activity record: %+v", es)
	}

	// A streaming response keeps it awake past the idle timeout: a CGI
	// that writes a line a second for 12 s.
	d.must("exec", "web", "--", "sh", "-c", `printf '#!/bin/sh\necho Content-Type: text/plain\necho\nfor i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo tick $i; sleep 1; done\n' > /tmp/www/cgi-bin/stream && chmod +x /tmp/www/cgi-bin/stream`)
	req, _ := http.NewRequest("GET", base+"cgi-bin/stream", nil)
	req.Header.Set("Authorization", "Bearer "+u.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	var got strings.Builder
	for {
		k, err := resp.Body.Read(buf)
		got.Write(buf[:k])
		if st := d.netInfo("web").State; st != "running" {
			t.Fatalf("web is %s with a response streaming (%q so far)", st, got.String())
		}
		if err != nil {
			break
		}
	}
	if !strings.Contains(got.String(), "tick 12") {
		t.Fatalf("the stream: %q", got.String())
	}

	// den forward: a local port to the VM's, over the agent channel.
	fwd := exec.Command(d.den, "forward", "web", "18480:8080")
	fwd.Env = append(os.Environ(), "DEN_SOCKET="+d.socket)
	var stderr strings.Builder
	fwd.Stderr = &stderr
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fwd.Process.Kill(); _ = fwd.Wait() }()
	var body string
	if !eventually(30*time.Second, func() bool {
		resp, err := http.Get("http://127.0.0.1:18480/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return true
	}) || body != "hi from web\n" {
		t.Fatalf("den forward: %q (%s)", body, stderr.String())
	}

	// A WebSocket-style upgrade passes through: a guest server on 8081
	// answers 101 and echoes what follows.
	d.must("exec", "web", "--", "sh", "-c", `printf '#!/bin/sh\nwhile IFS= read -r l; do l=$(printf %%s "$l" | tr -d "\\r"); [ -z "$l" ] && break; done\nprintf "HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n\\r\\n"\nexec cat\n' > /tmp/ws.sh && chmod +x /tmp/ws.sh && (nc -ll -p 8081 -e /tmp/ws.sh >/dev/null 2>&1 &)`)
	d.must("url", "web", "--port", "8081")
	conn, err := netns.Dialer(n.den)(context.Background(), "tcp", "127.0.0.1:8081")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(conn, "GET /vm/web/ws HTTP/1.1\r\nHost: den\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", u.Token)
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, " 101 ") {
		t.Fatalf("upgrade: %q %v", status, err)
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "\r\n" {
			break
		}
	}
	for _, msg := range []string{"ping 1\n", "ping 2\n"} {
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		if got, err := br.ReadString('\n'); err != nil || got != msg {
			t.Fatalf("echo over the upgraded connection: %q %v", got, err)
		}
	}
}
