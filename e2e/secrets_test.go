package e2e

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

// TestSecrets, one VM on TAP networking for both kinds of den's secrets.
//
// SSH: git push to a git server in a test namespace, with a key den
// holds: the VM is granted the secret, its git and ssh find the key
// through SSH_AUTH_SOCK, den signs for the server's host key.
//
// HTTPS: curl in the VM sends the placeholder it holds in $API to a
// test HTTPS server (its own CA, trusted by den through --secrets-ca),
// which gets the value; a host the secret does not name gets the
// placeholder, over a connection den does not touch.
//
// Neither value is in the VM's memory (a memory checkpoint's pages,
// where a value the guest computed is found) nor its disk (where a file
// it wrote is found). A fork has no grant, a revoke stops the next use
// at once, and the audit log and the activity record have each use.
func TestSecrets(t *testing.T) {
	n := newTestNet(t)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(blk)
	git := n.serveGitSSH(t, n.wan, wanHostA+":22", signer.PublicKey())
	n.serveDNS(n.wan, wanAddr, map[string]string{"git.test": wanHostA, "api.test": wanHostA, "other.test": wanHostB})
	dir := t.TempDir()
	web := n.serveHTTPS(t, n.wan, []string{"api.test", "other.test"}, wanHostA, wanHostB)
	caFile := filepath.Join(dir, "test-ca.pem")
	if err := os.WriteFile(caFile, web.ca, 0o644); err != nil {
		t.Fatal(err)
	}
	d := startNetDaemon(t, n, "--secrets-ca", caFile)

	keyFile, khFile := filepath.Join(dir, "key"), filepath.Join(dir, "hosts")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	kh := git.KnownHostsLine("git.test")
	if err := os.WriteFile(khFile, []byte(kh+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.must("create", "box", "--image", "debian", "--memory", "512M", "--idle-timeout", "0")
	out := d.must("secrets", "add", "deploy", "--known-hosts", khFile, "--from-file", keyFile)
	if !strings.Contains(out, "ssh-ed25519 ") {
		t.Fatalf("den secrets add: %q", out)
	}
	d.must("secrets", "grant", "box", "deploy")

	push := func(vm, msg string) (string, error) {
		return d.run("exec", vm, "--", "sh", "-c", `set -e
mkdir -p /root/.ssh && echo '`+kh+`' > /root/.ssh/known_hosts
cd /root && { [ -d w ] || git init -q w; } && cd w
git -c user.name=den -c user.email=den@test commit -q --allow-empty -m '`+msg+`'
timeout 60 git push -q ssh://git@git.test/repo.git HEAD:refs/heads/main 2>&1`)
	}
	if out, err := push("box", "one"); err != nil {
		t.Fatalf("git push with den's key: %v\n%s", err, out)
	}
	if git.Pushes() != 1 {
		t.Fatalf("the server saw %d pushes, want 1", git.Pushes())
	}
	if out := d.must("activity", "box", "--sessions"); !strings.Contains(out, "deploy: ssh signature for SHA256:") || !strings.Contains(out, "(git.test)") {
		t.Fatalf("the secret's use is not in the activity record:\n%s", out)
	}
	if out := d.must("exec", "box", "--", "sh", "-c", "ssh-add -L"); !strings.Contains(out, strings.Fields(string(gossh.MarshalAuthorizedKey(signer.PublicKey())))[1]) {
		t.Fatalf("ssh-add -L in the vm: %q", out)
	}

	// HTTPS: the value reaches api.test; the VM holds the placeholder.
	token := "Bearer e2e-" + rand.Text()
	if out, err := d.runIn([]byte(token+"\n"), "secrets", "add", "api", "--host", "api.test", "--header", "Authorization"); err != nil || !strings.Contains(out, "$API=den-secret:api") {
		t.Fatalf("den secrets add api: %v\n%s", err, out)
	}
	d.must("secrets", "grant", "box", "api")
	// The test CA in the VM, for a connection den does not touch.
	d.must("exec", "box", "--", "sh", "-c", "cat > /root/test-ca.pem <<'EOF'\n"+string(web.ca)+"EOF")
	// curl sends the placeholder; it is what the server got.
	curl := func(vm, url string, extra ...string) string {
		t.Helper()
		args := append([]string{"exec", vm, "--", "curl", "-sS", "--max-time", "60", "-H", "Authorization: den-secret:api"}, extra...)
		if out := d.must(append(args, url)...); out != "ok" {
			t.Fatalf("curl %s in %s: %q", url, vm, out)
		}
		return web.Last()
	}
	if out := d.must("exec", "box", "--", "sh", "-c", "echo $API"); strings.TrimSpace(out) != "den-secret:api" {
		t.Fatalf("$API in the vm: %q", out)
	}
	if got := curl("box", "https://api.test/echo?x=1"); got != token {
		t.Fatalf("the server got %q, want the value", got)
	}
	if out := curl("box", "https://other.test/", "--cacert", "/root/test-ca.pem"); out != "den-secret:api" {
		t.Fatalf("a host the secret does not name got %q (want the placeholder, over the server's own certificate)", out)
	}
	if out := d.must("activity", "box", "--sessions"); !strings.Contains(out, "api: https GET https://api.test/echo: 200") {
		t.Fatalf("the https secret's use is not in the activity record:\n%s", out)
	}

	// Memory and disk hold what the guest has, never the key: a value
	// the guest computed is found in the memory checkpoint's pages, a
	// file it wrote in its disk; the key's text and its seed in neither.
	d.must("exec", "box", "--", "sh", "-c", `nohup sh -c 'c=DENCANARY$((6*7))XYZ; while :; do sleep 1000; done' >/dev/null 2>&1 &
echo den-disk-canary-$((6*7)) > /root/canary; sync`)
	d.must("checkpoint", "box")
	// The key's seed, and the PEM's lines that carry its random check
	// words and its seed (its first lines are the same for every
	// ed25519 key, and the guest has keys of its own).
	lines := strings.Split(string(keyPEM), "\n")
	needles := [][]byte{priv.Seed(), []byte(lines[3]), []byte(lines[4]), []byte(token)}
	scan := func(what string, canary []byte, files ...string) {
		t.Helper()
		found := false
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			got := grepFile(t, fh, append([][]byte{canary}, needles...))
			fh.Close()
			found = found || got[0]
			for i, hit := range got[1:] {
				if hit {
					t.Errorf("den's key (needle %d) is in the vm's %s: %s", i, what, f)
				}
			}
		}
		if !found {
			t.Fatalf("the canary %q is not in the vm's %s: the scan proves nothing", canary, what)
		}
	}
	var packs []string
	_ = filepath.Walk(d.volumePath("memstore"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			packs = append(packs, p)
		}
		return nil
	})
	scan("memory", []byte("DENCANARY42XYZ"), packs...)
	scan("disk", []byte("den-disk-canary-42"), d.volumePath("vms", "box", "disk"))

	// A fork has no grant; --with-secrets gives it the source's.
	d.must("fork", "box", "twin")
	if out, err := d.run("exec", "twin", "--", "sh", "-c", "ssh-add -L"); err == nil {
		t.Fatalf("a fork without --with-secrets lists den's key: %q", out)
	}
	if out, err := push("twin", "from the fork"); err == nil {
		t.Fatalf("a fork without --with-secrets pushed: %s", out)
	}
	if out := d.must("exec", "twin", "--", "sh", "-c", "echo x${API}x"); strings.TrimSpace(out) != "xx" {
		t.Fatalf("a fork without --with-secrets has $API: %q", out)
	}
	if got := curl("twin", "https://api.test/", "--cacert", "/root/test-ca.pem"); got != "den-secret:api" {
		t.Fatalf("a fork without --with-secrets: the server got %q, want the placeholder", got)
	}
	d.must("rm", "--force", "twin")
	d.must("fork", "box", "twin", "--with-secrets")
	if out := d.must("exec", "twin", "--", "sh", "-c", "ssh-add -L"); !strings.Contains(out, "den secret deploy") {
		t.Fatalf("a fork --with-secrets does not list den's key: %q", out)
	}
	if got := curl("twin", "https://api.test/"); got != token {
		t.Fatalf("a fork --with-secrets: the server got %q", got)
	}
	d.must("rm", "--force", "twin")

	// A revoke stops the next use at once.
	d.must("secrets", "revoke", "box", "api")
	// den no longer takes api.test: the VM's curl meets the server's own
	// certificate.
	if got := curl("box", "https://api.test/", "--cacert", "/root/test-ca.pem"); got != "den-secret:api" {
		t.Fatalf("after the revoke the server got %q, want the placeholder", got)
	}
	d.must("secrets", "revoke", "box", "deploy")
	if out, err := push("box", "two"); err == nil {
		t.Fatalf("a push after the revoke: %s", out)
	}
	if git.Pushes() != 1 {
		t.Fatalf("the server saw %d pushes after the revoke, want 1", git.Pushes())
	}
	if out := d.must("audit", "--vm", "box"); !strings.Contains(out, "secret deploy ssh sign") || !strings.Contains(out, "secret api https") {
		t.Fatalf("the secret's use is not in the audit log:\n%s", out)
	}
}

// grepFile says, for each needle, whether r holds it.
func grepFile(t *testing.T, r io.Reader, needles [][]byte) []bool {
	t.Helper()
	found := make([]bool, len(needles))
	longest := 0
	for _, n := range needles {
		longest = max(longest, len(n))
	}
	buf := make([]byte, 4<<20)
	carry := 0
	for {
		k, err := r.Read(buf[carry:])
		window := buf[:carry+k]
		for i, n := range needles {
			found[i] = found[i] || bytes.Contains(window, n)
		}
		if err == io.EOF || k == 0 {
			return found
		}
		if err != nil {
			t.Fatal(err)
		}
		carry = min(longest-1, len(window))
		copy(buf, window[len(window)-carry:])
	}
}
