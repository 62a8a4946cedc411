package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/denhq/den/agent"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGateway reaches VMs with plain OpenSSH through the gateway.
func TestGateway(t *testing.T) {
	d := startDaemon(t)
	g := newGW(t, d)
	alice, bob, stranger := g.key("alice"), g.key("bob"), g.key("stranger")
	d.must("keys", "add", alice+".pub") // user "default", the owner of box
	if out := d.must("keys", "add", "--user", "bob", "--name", "bobs-key", bob+".pub"); !strings.Contains(out, "for user bob") {
		t.Fatalf("keys add: %q", out)
	}
	if _, err := d.run("keys", "add", "--user", "mallory", alice+".pub"); exitCode(err) == 0 || !strings.Contains(stderrOf(err), "registered already") {
		t.Fatalf("a key added twice: %v", err)
	}
	d.must("create", "box", "--memory", "256M")
	const vm = "box@127.0.0.1"

	t.Run("exec", func(t *testing.T) {
		if out, errs, code := g.ssh(alice, nil, vm, "true"); out != "" || errs != "" || code != 0 {
			t.Fatalf("true: %q %q %d", out, errs, code)
		}
		out, errs, code := g.ssh(alice, nil, vm, "echo out; echo err >&2; exit 7")
		if out != "out\n" || errs != "err\n" || code != 7 {
			t.Fatalf("exit 7: %q %q %d", out, errs, code)
		}
		if out, _, code := g.ssh(alice, []byte("hello from stdin\n"), vm, "tr a-z A-Z"); out != "HELLO FROM STDIN\n" || code != 0 {
			t.Fatalf("stdin: %q %d", out, code)
		}
		if out, _, _ := g.ssh(alice, nil, vm, "hostname; tty || true"); out != "box\nnot a tty\n" {
			t.Fatalf("hostname, no tty: %q", out)
		}
		if out, _, _ := g.ssh(alice, nil, "-o", "SetEnv=GREETING=hi-there", vm, "echo $GREETING"); out != "hi-there\n" {
			t.Fatalf("env: %q", out)
		}
	})

	t.Run("pty", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := g.sshCmd(ctx, alice, vm)
		cmd.Env = append(os.Environ(), "TERM=xterm")
		checkPTYSession(t, cmd)
	})

	t.Run("scp and sftp", func(t *testing.T) {
		data := make([]byte, 3<<20+123)
		rand.Read(data)
		sum := sha256.Sum256(data)
		want := hex.EncodeToString(sum[:])
		local := filepath.Join(g.dir, "data.bin")
		if err := os.WriteFile(local, data, 0o600); err != nil {
			t.Fatal(err)
		}
		guestSum := func(path string) string {
			out, errs, code := g.ssh(alice, nil, vm, "sha256sum "+path)
			if code != 0 {
				t.Fatalf("sha256sum %s: %s", path, errs)
			}
			return strings.Fields(out + " -")[0]
		}
		localSum := func(path string) string {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s := sha256.Sum256(b)
			return hex.EncodeToString(s[:])
		}
		scp := func(args ...string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "scp", append(append(g.opts(alice), "-P", g.port), args...)...)
			if _, errs, code := runTool(t, cmd, nil); code != 0 {
				t.Fatalf("scp %s: %d %s", strings.Join(args, " "), code, errs)
			}
		}
		// scp speaks the sftp protocol (OpenSSH 9's default).
		scp(local, vm+":/root/up.bin")
		if got := guestSum("/root/up.bin"); got != want {
			t.Fatalf("scp up: %s, want %s", got, want)
		}
		scp(vm+":/root/up.bin", filepath.Join(g.dir, "down.bin"))
		if got := localSum(filepath.Join(g.dir, "down.bin")); got != want {
			t.Fatalf("scp down: %s, want %s", got, want)
		}
		// sftp, both ways.
		batch := fmt.Sprintf("put %s /root/sftp.bin\nget /root/sftp.bin %s\n", local, filepath.Join(g.dir, "sftp-down.bin"))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sftp", append(append(g.opts(alice), "-P", g.port, "-b", "-"), vm)...)
		if _, errs, code := runTool(t, cmd, []byte(batch)); code != 0 {
			t.Fatalf("sftp: %d %s", code, errs)
		}
		if got := guestSum("/root/sftp.bin"); got != want {
			t.Fatalf("sftp put: %s, want %s", got, want)
		}
		if got := localSum(filepath.Join(g.dir, "sftp-down.bin")); got != want {
			t.Fatalf("sftp get: %s, want %s", got, want)
		}
		// Legacy scp (-O) runs `scp -t` in the guest: it works where the
		// image has an scp binary; the minimal image has none.
		_, _, hasSCP := g.ssh(alice, nil, vm, "command -v scp")
		cmd = exec.CommandContext(ctx, "scp", append(append(g.opts(alice), "-O", "-P", g.port), local, vm+":/root/legacy.bin")...)
		_, errs, code := runTool(t, cmd, nil)
		switch {
		case hasSCP == 0 && code != 0:
			t.Fatalf("scp -O: %d %s", code, errs)
		case hasSCP == 0:
			if got := guestSum("/root/legacy.bin"); got != want {
				t.Fatalf("scp -O: %s, want %s", got, want)
			}
		case code == 0 || !strings.Contains(errs, "scp: not found"):
			t.Fatalf("scp -O without scp in the guest: %d %q", code, errs)
		default:
			t.Logf("scp -O: the guest image has no scp binary: %s", strings.TrimSpace(errs))
		}
	})

	t.Run("local forward", func(t *testing.T) {
		if _, errs, code := g.ssh(alice, nil, vm, "mkdir -p /tmp/www && echo hello-from-guest > /tmp/www/index.html && httpd -p 8080 -h /tmp/www"); code != 0 {
			t.Fatalf("httpd in the guest: %s", errs)
		}
		port := freePort(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		fwd := g.sshCmd(ctx, alice, "-N", "-L", port+":127.0.0.1:8080", vm)
		var errb bytes.Buffer
		fwd.Stderr = &errb
		if err := fwd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = fwd.Process.Kill(); _ = fwd.Wait() }()
		var body string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			resp, err := http.Get("http://127.0.0.1:" + port + "/index.html")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if body = string(b); resp.StatusCode == 200 {
				break
			}
		}
		if body != "hello-from-guest\n" {
			t.Fatalf("through ssh -L: %q (ssh: %s)", body, errb.String())
		}
	})

	t.Run("agent forwarding refused", func(t *testing.T) {
		sock := filepath.Join(g.dir, "agent.sock")
		ag := exec.Command("ssh-agent", "-D", "-a", sock)
		if err := ag.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ag.Process.Kill(); _ = ag.Wait() }()
		for i := 0; i < 50; i++ {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// ssh takes an option's first value: this one before opts' "none".
		args := append(append([]string{"-o", "IdentityAgent=" + sock}, g.opts(alice)...), "-p", g.port, "-A", vm, "echo ${SSH_AUTH_SOCK:-none}")
		cmd := exec.CommandContext(ctx, "ssh", args...)
		out, errs, code := runTool(t, cmd, nil)
		// The session has den's own agent socket (den secrets), not one
		// carrying the client's agent.
		if out != agent.KeyAgentSocket+"\n" || code != 0 || !strings.Contains(errs, "agent forwarding (-A) is not available") {
			t.Fatalf("-A: %q %q %d", out, errs, code)
		}
	})

	t.Run("den verbs", func(t *testing.T) {
		out, errs, code := g.ssh(alice, nil, "den@127.0.0.1", "ls")
		if code != 0 || !strings.HasPrefix(out, "NAME ") || !strings.Contains(out, "\nbox ") {
			t.Fatalf("den@ ls: %q %q %d", out, errs, code)
		}
		// bob creates a VM of his own; alice does not see it, and the
		// output is the CLI's.
		out, errs, code = g.ssh(bob, nil, "den@127.0.0.1", "create bobs --memory 256M --json")
		var created vmJSON
		if code != 0 || json.Unmarshal([]byte(out), &created) != nil || created.State != "running" {
			t.Fatalf("den@ create: %q %q %d", out, errs, code)
		}
		names := func(key string) []string {
			out, errs, code := g.ssh(key, nil, "den@127.0.0.1", "ls --json")
			var vms []vmJSON
			if code != 0 || json.Unmarshal([]byte(out), &vms) != nil {
				t.Fatalf("den@ ls --json: %q %q %d", out, errs, code)
			}
			var n []string
			for _, v := range vms {
				n = append(n, v.Name)
			}
			return n
		}
		if a, b := names(alice), names(bob); !slices.Equal(a, []string{"box"}) || !slices.Equal(b, []string{"bobs"}) {
			t.Fatalf("alice sees %v, bob sees %v", a, b)
		}
		if out, _, code := g.ssh(bob, nil, "bobs@127.0.0.1", "hostname"); out != "bobs\n" || code != 0 {
			t.Fatalf("bob in his vm: %q %d", out, code)
		}
		// bob adds a key of his own (on stdin: den@ reads no host files).
		bob2 := g.key("bob2")
		pub, _ := os.ReadFile(bob2 + ".pub")
		// Another user's name is refused, not replaced by his own.
		if _, errs, code := g.ssh(bob, pub, "den@127.0.0.1", "keys add --user mallory -"); code == 0 || !strings.Contains(errs, "forbidden") {
			t.Fatalf("den@ keys add --user mallory: %q %d; want forbidden", errs, code)
		}
		if out, errs, code := g.ssh(bob, pub, "den@127.0.0.1", "keys add -"); code != 0 || !strings.Contains(out, "for user bob") {
			t.Fatalf("den@ keys add: %q %q %d", out, errs, code)
		}
		if _, errs, code := g.ssh(bob, nil, "den@127.0.0.1", "keys add /etc/ssh/ssh_host_ed25519_key.pub"); code == 0 || !strings.Contains(errs, "stdin") {
			t.Fatalf("den@ keys add FILE: %q %d", errs, code)
		}
		if out, _, _ := g.ssh(bob2, nil, "den@127.0.0.1", "keys ls"); !strings.Contains(out, "bobs-key") || !strings.Contains(out, "bob2@test") || strings.Contains(out, "alice@test") {
			t.Fatalf("bob's keys: %q", out)
		}
		out, errs, code = g.ssh(bob, nil, "den@127.0.0.1", "exec bobs -- sh -c 'echo \"$0 $1\"' 'a b' c")
		if out != "a b c\n" || code != 0 {
			t.Fatalf("den@ exec quoting: %q %q %d", out, errs, code)
		}
		// Every spelling that would reach --socket: before "--", after
		// it through a subverb, and as a subverb's own flag.
		for _, verb := range []string{"daemon", "doctor", "ls --socket /run/other.sock",
			"keys -- ls --socket /run/other.sock", "keys ls -- --socket=/run/other.sock", "checkpoint -- verify bobs --socket /run/other.sock"} {
			if _, errs, code := g.ssh(bob, nil, "den@127.0.0.1", verb); code != 2 || strings.Count(errs, "\n") != 1 {
				t.Fatalf("den@ %s: %d %q", verb, code, errs)
			}
		}
		if _, errs, code := g.ssh(bob, nil, "den@127.0.0.1", "rm box"); code == 0 || !strings.Contains(errs, `no vm named "box"`) {
			t.Fatalf("bob removing alice's vm: %d %q", code, errs)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		// Another user's VM and no VM at all: the same single line.
		_, notYours, code1 := g.ssh(bob, nil, vm, "true")
		_, missing, code2 := g.ssh(bob, nil, "ghost@127.0.0.1", "true")
		if code1 != 255 || code2 != 255 || strings.ReplaceAll(missing, "ghost", "box") != notYours ||
			notYours != "den: no vm named \"box\" for user \"bob\"\n" {
			t.Fatalf("not yours %d %q, missing %d %q", code1, notYours, code2, missing)
		}
		// The same with a pty (no -t complaint, one line).
		_, errs, code := g.ssh(bob, nil, "-tt", "ghost@127.0.0.1")
		if code != 255 || strings.TrimSpace(errs) != `den: no vm named "ghost" for user "bob"` {
			t.Fatalf("with a pty: %d %q", code, errs)
		}
		// An unregistered key.
		_, errs, code = g.ssh(stranger, nil, vm, "true")
		if code != 255 || strings.TrimSpace(errs) != "box@127.0.0.1: Permission denied (publickey)." {
			t.Fatalf("stranger: %d %q", code, errs)
		}
		// A removed key.
		d.must("keys", "rm", "bobs-key")
		if _, errs, code := g.ssh(bob, nil, "bobs@127.0.0.1", "true"); code != 255 || !strings.Contains(errs, "Permission denied") {
			t.Fatalf("removed key: %d %q", code, errs)
		}
	})

	t.Run("sleeping vm woken", func(t *testing.T) {
		d.must("sleep", "box")
		if st := d.info("box").State; st != "sleeping" {
			t.Fatalf("state after sleep: %s", st)
		}
		start := time.Now()
		if out, errs, code := g.ssh(alice, nil, vm, "cat /tmp/www/index.html"); out != "hello-from-guest\n" || code != 0 {
			t.Fatalf("ssh to a sleeping vm: %q %q %d", out, errs, code)
		}
		t.Logf("ssh to a sleeping vm: %v", time.Since(start).Round(time.Millisecond))
		if st := d.info("box").State; st != "running" {
			t.Fatalf("state after ssh: %s", st)
		}
	})

	t.Run("timings", func(t *testing.T) {
		median := func(what string, before func(), run func() error) {
			var ds []time.Duration
			for i := 0; i < 5; i++ {
				if before != nil {
					before()
				}
				start := time.Now()
				if err := run(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				ds = append(ds, time.Since(start))
			}
			slices.Sort(ds)
			t.Logf("%-30s median %v (min %v, max %v)", what, ds[2].Round(time.Millisecond), ds[0].Round(time.Millisecond), ds[4].Round(time.Millisecond))
		}
		ssh := func(want string, args ...string) func() error {
			return func() error {
				if out, errs, code := g.ssh(alice, nil, append([]string{vm}, args...)...); code != 0 || out != want {
					return fmt.Errorf("%q %q %d", out, errs, code)
				}
				return nil
			}
		}
		median("running: ssh box true", nil, ssh("", "true"))
		median("running: ssh box echo hi", nil, ssh("hi\n", "echo hi"))
		median("running: den exec box true", nil, func() error { _, err := d.run("exec", "box", "--", "true"); return err })
		asleep := func() { d.must("sleep", "box") }
		median("sleeping: ssh box true", asleep, ssh("", "true"))
		median("sleeping: ssh box echo hi", asleep, ssh("hi\n", "echo hi"))
	})
}

// TestGatewayLegacySCP runs scp's old protocol (scp -O), which runs
// `scp -t` in the guest: the debian image has scp, the minimal one not.
func TestGatewayLegacySCP(t *testing.T) {
	d := startDaemon(t)
	g := newGW(t, d)
	key := g.key("alice")
	d.must("keys", "add", key+".pub")
	d.must("create", "deb", "--image", "debian")
	const vm = "deb@127.0.0.1"
	data := make([]byte, 1<<20+7)
	rand.Read(data)
	sum := sha256.Sum256(data)
	local := filepath.Join(g.dir, "data.bin")
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
	scp := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "scp", append(append(g.opts(key), "-O", "-P", g.port), args...)...)
		if _, errs, code := runTool(t, cmd, nil); code != 0 {
			t.Fatalf("scp -O %s: %d %s", strings.Join(args, " "), code, errs)
		}
	}
	scp(local, vm+":/root/up.bin")
	if out, errs, _ := g.ssh(key, nil, vm, "sha256sum /root/up.bin"); !strings.HasPrefix(out, hex.EncodeToString(sum[:])) {
		t.Fatalf("scp -O up: %q %q", out, errs)
	}
	scp(vm+":/root/up.bin", filepath.Join(g.dir, "down.bin"))
	if got, _ := os.ReadFile(filepath.Join(g.dir, "down.bin")); sha256.Sum256(got) != sum {
		t.Fatal("scp -O down: checksum mismatch")
	}
}
