package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
)

// osUser is a local user a test runs den as.
type osUser struct {
	name     string
	uid, gid uint32
}

var usersMu sync.Mutex

// localUser returns the local user name, made (a system user without a
// home) when missing, and added to groups (made when missing).
func localUser(t testing.TB, name string, groups ...string) osUser {
	t.Helper()
	usersMu.Lock()
	defer usersMu.Unlock()
	for _, g := range groups {
		if _, err := user.LookupGroup(g); err != nil {
			if out, err := exec.Command("groupadd", "--system", g).CombinedOutput(); err != nil {
				t.Fatalf("groupadd %s: %v\n%s", g, err, out)
			}
		}
	}
	if _, err := user.Lookup(name); err != nil {
		args := []string{"--system", "--no-create-home", "--shell", "/usr/sbin/nologin"}
		if len(groups) > 0 {
			args = append(args, "--groups", strings.Join(groups, ","))
		}
		if out, err := exec.Command("useradd", append(args, name)...).CombinedOutput(); err != nil {
			t.Fatalf("useradd %s: %v\n%s", name, err, out)
		}
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return osUser{name: name, uid: uint32(uid), gid: uint32(gid)}
}

// reachableBy opens the way to the daemon's socket and den binary for
// local users other than root (t.TempDir and MkdirTemp make 0700 dirs).
func (d *daemon) reachableBy() {
	d.t.Helper()
	for _, dir := range []string{filepath.Dir(d.socket), filepath.Dir(d.den), filepath.Dir(filepath.Dir(d.den))} {
		if err := os.Chmod(dir, 0o711); err != nil {
			d.t.Fatal(err)
		}
	}
}

// runAs runs den as the local user u (uid and gid only: no root, no
// environment but the socket's path).
func (d *daemon) runAs(u osUser, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.den, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEN_SOCKET=" + d.socket, "HOME=/"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, NoSetGroups: false}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &runError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), nil
}

func (d *daemon) mustAs(u osUser, args ...string) string {
	d.t.Helper()
	out, err := d.runAs(u, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// TestLocalUsers: local users reach the daemon's socket without sudo, as
// themselves: each sees and touches only their own VMs, by name or by
// checkpoint; an admin (root, or a member of den-admin) sees all; a uid
// without a name is refused; nothing the client says changes who it is.
func TestLocalUsers(t *testing.T) {
	d := startDaemon(t)
	d.reachableBy()
	alice, bob := localUser(t, "den-alice"), localUser(t, "den-bob")
	carol := localUser(t, "den-carol", "den-admin")

	d.mustAs(alice, "create", "abox", "--memory", "256M", "--idle-timeout", "0")
	if out := d.mustAs(alice, "exec", "abox", "--", "echo", "hi"); out != "hi\n" {
		t.Fatalf("alice's exec: %q", out)
	}
	d.mustAs(alice, "checkpoint", "abox", "-m", "one")
	var vm vmJSON
	if err := json.Unmarshal([]byte(d.mustAs(alice, "info", "abox", "--json")), &vm); err != nil || vm.Owner != "den-alice" {
		t.Fatalf("alice's vm: %+v %v; want owner den-alice", vm, err)
	}

	// bob: every verb on alice's VM is "no vm named", and changes nothing.
	for _, args := range [][]string{
		{"info", "abox"}, {"exec", "abox", "--", "true"}, {"logs", "abox"}, {"checkpoint", "abox"},
		{"checkpoints", "abox"}, {"restore", "abox", "cp-1"}, {"fork", "abox@cp-1", "bcopy"}, {"fork", "abox", "bcopy"},
		{"sleep", "abox"}, {"wake", "abox"}, {"resize", "abox", "--disk", "8G"}, {"rm", "abox"}, {"rm", "--force", "abox"},
		{"net", "policy", "abox", "deny-all"}, {"url", "abox"},
	} {
		_, err := d.runAs(bob, args...)
		if err == nil || !strings.Contains(stderrOf(err), `no vm named "abox"`) {
			t.Errorf("bob: den %s: %v; want no vm named", strings.Join(args, " "), err)
		}
	}
	if out := strings.TrimSpace(d.mustAs(bob, "ls", "--json")); out != "[]" {
		t.Errorf("bob's ls: %s", out)
	}

	// Nor does a name tell whose it is, on create or on fork.
	if _, err := d.runAs(bob, "create", "abox"); err == nil || !strings.Contains(stderrOf(err), "the name is taken") || strings.Contains(stderrOf(err), "alice") {
		t.Errorf("bob creating alice's name: %v", err)
	}
	d.mustAs(bob, "create", "bbox", "--memory", "256M", "--idle-timeout", "0")
	if _, err := d.runAs(bob, "fork", "bbox", "abox"); err == nil || !strings.Contains(stderrOf(err), "is taken") || strings.Contains(stderrOf(err), "alice") {
		t.Errorf("bob forking onto alice's name: %v", err)
	}
	// What bob's environment says of him counts for nothing.
	cmd := exec.Command(d.den, "ls", "--json")
	cmd.Env = []string{"DEN_SOCKET=" + d.socket, "DEN_OWNER=den-alice"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: bob.uid, Gid: bob.gid}}
	if out, err := cmd.Output(); err != nil || strings.Contains(string(out), "abox") || !strings.Contains(string(out), "bbox") {
		t.Errorf("bob with DEN_OWNER=den-alice: %q %v", out, err)
	}
	// The host's sleep is an admin's.
	if _, err := d.runAs(bob, "sleep", "--all"); err == nil || !strings.Contains(stderrOf(err), "admin") {
		t.Errorf("bob: sleep --all: %v", err)
	}
	// A field only an admin may set is refused (403), not quietly
	// replaced by the caller's own name.
	pub := filepath.Join(filepath.Dir(d.state), "bob.pub")
	if err := os.WriteFile(pub, []byte(testutil.PublicKey(t)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.runAs(bob, "keys", "add", "--user", "den-alice", pub); err == nil || !strings.Contains(stderrOf(err), "forbidden") {
		t.Errorf("bob adds a key for alice: %v; want forbidden", err)
	}
	if _, err := d.runAs(bob, "audit", "--user", "den-alice"); err == nil || !strings.Contains(stderrOf(err), "forbidden") {
		t.Errorf("bob reads alice's audit: %v; want forbidden", err)
	}
	if out := d.must("keys", "ls", "--json"); strings.Contains(out, "den-alice") || strings.Contains(out, "den-bob") {
		t.Errorf("keys after the refusals: %s", out)
	}
	d.mustAs(bob, "keys", "add", pub) // his own

	// carol (den-admin) and root see alice's VM; a uid with no name is refused.
	for _, u := range []osUser{carol, {name: "root"}} {
		if out := d.mustAs(u, "ls"); !strings.Contains(out, "abox") {
			t.Errorf("%s's ls: %q", u.name, out)
		}
	}
	if _, err := d.runAs(osUser{name: "nobody-at-all", uid: 54321, gid: 54321}, "ls"); err == nil || !strings.Contains(stderrOf(err), "uid 54321 has no user name") {
		t.Errorf("a uid without a name: %v", err)
	}
	// alice's VM is as she left it.
	if out := d.mustAs(alice, "exec", "abox", "--", "echo", "still"); out != "still\n" {
		t.Fatalf("alice's exec after bob: %q", out)
	}
	if out := d.mustAs(alice, "checkpoints", "abox"); !strings.Contains(out, "cp-1") {
		t.Errorf("alice's checkpoints: %q", out)
	}
	d.mustAs(alice, "rm", "abox")
}

// TestAPITokens: the API over TLS with a bearer token acts as the
// token's user; a wrong, another user's or a revoked token is refused;
// no secret is stored in clear; and the audit log shows each user their
// own calls.
func TestAPITokens(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--api-listen", "127.0.0.1:0"} })
	d.reachableBy()
	alice, bob := localUser(t, "den-alice"), localUser(t, "den-bob")
	var info struct {
		API            string `json:"api"`
		APIFingerprint string `json:"api_fingerprint"`
	}
	if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil || info.API == "" {
		t.Fatalf("den info: %+v %v", info, err)
	}
	ca := filepath.Join(d.state, "keys", "api.crt")
	d.mustAs(alice, "create", "tbox", "--memory", "256M", "--idle-timeout", "0")
	secret := strings.TrimSpace(d.mustAs(alice, "tokens", "add", "laptop"))
	bobSecret := strings.TrimSpace(d.mustAs(bob, "tokens", "add", "ci"))
	if !strings.HasPrefix(secret, "den_") || secret == bobSecret {
		t.Fatalf("secrets %q %q", secret, bobSecret)
	}
	remote := func(token string, args ...string) (string, error) {
		// The flags right after the verb: after exec's --, words are the command's.
		return d.run(append([]string{args[0], "--url", "https://" + info.API, "--token", token, "--ca", ca}, args[1:]...)...)
	}
	if out, err := remote(secret, "ls"); err != nil || !strings.Contains(out, "tbox") {
		t.Fatalf("alice's token: ls: %q %v", out, err)
	}
	if out, err := remote(secret, "exec", "tbox", "--", "echo", "over-tls"); err != nil || out != "over-tls\n" {
		t.Fatalf("alice's token: exec: %q %v", out, err)
	}
	if _, err := remote(bobSecret, "info", "tbox"); err == nil || !strings.Contains(stderrOf(err), `no vm named "tbox"`) {
		t.Errorf("bob's token reads alice's vm: %v", err)
	}
	wrong := secret[:len(secret)-3] + "abc"
	for _, tok := range []string{wrong, "den_nope", "garbage"} {
		if _, err := remote(tok, "ls"); err == nil || !strings.Contains(stderrOf(err), "unauthenticated") {
			t.Errorf("token %.10q: %v; want unauthenticated", tok, err)
		}
	}
	// Without --ca the self-signed certificate is not trusted.
	if _, err := d.run("ls", "--url", "https://"+info.API, "--token", secret); err == nil {
		t.Error("an untrusted certificate was accepted")
	}
	// Revoked: refused from the next request on.
	if _, err := d.runAs(bob, "tokens", "rm", "laptop"); err == nil {
		t.Error("bob revoked alice's token")
	}
	d.mustAs(alice, "tokens", "rm", "laptop")
	if _, err := remote(secret, "ls"); err == nil || !strings.Contains(stderrOf(err), "unauthenticated") {
		t.Errorf("a revoked token: %v", err)
	}
	// Not in clear anywhere in the state dir: the registry, logs, keys
	// (not the embedded volume's data nor guest RAM).
	filepath.WalkDir(d.state, func(p string, e os.DirEntry, err error) error {
		if e != nil && e.IsDir() && (e.Name() == "juicefs" || e.Name() == "ram") {
			return filepath.SkipDir
		}
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		if fi, err := e.Info(); err != nil || fi.Size() > 64<<20 {
			return nil
		}
		if data, err := os.ReadFile(p); err == nil && (bytes.Contains(data, []byte(secret)) || bytes.Contains(data, []byte(bobSecret))) {
			t.Errorf("%s holds a token's secret", p)
		}
		return nil
	})
	// The audit log: alice's exec over TLS, and nothing of bob's for her.
	var recs []struct{ User, Source, Verb, VM, Result string }
	if err := json.Unmarshal([]byte(d.mustAs(alice, "audit", "--json", "--limit", "0")), &recs); err != nil || len(recs) == 0 {
		t.Fatalf("alice's audit: %v", err)
	}
	sawTLS := false
	for _, r := range recs {
		if r.User != "den-alice" {
			t.Errorf("alice's audit shows %+v", r)
		}
		if strings.HasPrefix(r.Source, "tls ") && r.VM == "tbox" && strings.Contains(r.Verb, "/ssh") {
			sawTLS = true
		}
	}
	if !sawTLS {
		t.Errorf("alice's exec over TLS is not in her audit log: %+v", recs)
	}
	if out := d.must("audit", "--user", "den-bob"); !strings.Contains(out, "den-bob") || strings.Contains(out, "den-alice") {
		t.Errorf("root's audit of bob:\n%s", out)
	}
}
