package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hostService serves marker on 127.0.0.1 (a host service a guest must
// never reach) and returns its port.
func hostService(t *testing.T, marker string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, marker) }),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestGatewayConfinement: through `ssh den@host` no verb or flag reads
// or writes a host file or reaches another daemon; -L forwards reach
// inside the guest only, never the host's loopback, not even by the
// user-mode network's gateway address (10.0.2.2; from inside the guest:
// TestConfinedVMM).
func TestGatewayConfinement(t *testing.T) {
	d := startDaemon(t)
	g := newGW(t, d)
	bob := g.key("bob")
	d.must("keys", "add", "--user", "bob", bob+".pub")
	secret := "host-secret-" + fmt.Sprint(time.Now().UnixNano())
	secretFile := filepath.Join(g.dir, "secret")
	if err := os.WriteFile(secretFile, []byte("ssh-ed25519 "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(g.dir, "evil")
	const den = "den@127.0.0.1"

	t.Run("host paths", func(t *testing.T) {
		for _, cmd := range []string{
			"keys add " + secretFile, "keys add /etc/shadow", "keys add --name x " + secretFile, "keys -- add " + secretFile,
			"ls --socket " + d.socket, "ls --socket=" + d.socket, "ls -socket " + d.socket, "keys ls -- --socket=" + d.socket,
			"ls --url https://127.0.0.1:1", "ls --token x", "ls --ca " + secretFile, "ls --ca=" + secretFile,
			"create x --images " + evil, "daemon --state-dir " + evil, "daemon --volume-config " + secretFile,
			"doctor", "bench --out " + evil, "ssh x", "forward x 1:1", "help daemon",
			"ls --state-dir " + evil, "ls --volume-config " + secretFile,
		} {
			out, errs, code := g.ssh(bob, nil, den, cmd)
			if code != 2 || strings.Count(errs, "\n") != 1 || out != "" {
				t.Errorf("den@ %s: exit %d, %q %q; want 2 and one line", cmd, code, out, errs)
			}
			if strings.Contains(out+errs, secret) || strings.Contains(out+errs, "root:") {
				t.Errorf("den@ %s showed a host file: %q", cmd, out+errs)
			}
		}
		if _, err := os.Stat(evil); err == nil {
			t.Errorf("%s was made through the gateway", evil)
		}
		if out := d.must("keys", "ls"); strings.Contains(out, secret) || strings.Count(out, "\n") != 2 {
			t.Errorf("keys after the refusals:\n%s", out)
		}
	})

	t.Run("forwards reach the guest only", func(t *testing.T) {
		port := hostService(t, "host-loopback")
		// bob's own VM, made through the gateway, so that his key reaches it.
		out, errs, code := g.ssh(bob, nil, den, "create bfw --memory 256M --idle-timeout 0")
		if code != 0 {
			t.Fatalf("den@ create: %q %q", out, errs)
		}
		if _, errs, code := g.ssh(bob, nil, "bfw@127.0.0.1", "mkdir -p /tmp/www && echo guest-loopback > /tmp/www/index.html && httpd -p 127.0.0.1:"+port+" -h /tmp/www"); code != 0 {
			t.Fatalf("httpd in bfw: %s", errs)
		}
		get := func(target string) string {
			local := freePort(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			fwd := g.sshCmd(ctx, bob, "-N", "-L", local+":"+target, "bfw@127.0.0.1")
			var errb bytes.Buffer
			fwd.Stderr = &errb
			if err := fwd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = fwd.Process.Kill(); _ = fwd.Wait() }()
			body := ""
			hc := &http.Client{Timeout: 10 * time.Second}
			eventually(30*time.Second, func() bool {
				resp, err := hc.Get("http://127.0.0.1:" + local + "/index.html")
				if err != nil {
					return false
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				return true
			})
			return body
		}
		if body := get("127.0.0.1:" + port); body != "guest-loopback\n" {
			t.Errorf("-L to 127.0.0.1:%s: %q; want the guest's own service", port, body)
		}
		if body := get("10.0.2.2:" + port); strings.Contains(body, "host-loopback") {
			t.Errorf("-L to 10.0.2.2:%s reached the host's loopback: %q", port, body)
		}
	})
}
