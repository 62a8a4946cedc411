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
	// Nor does a name tell whose it is.
	if _, err := d.runAs(bob, "create", "abox"); err == nil || !strings.Contains(stderrOf(err), "the name is taken") || strings.Contains(stderrOf(err), "alice") {
		t.Errorf("bob creating alice's name: %v", err)
	}
	// What bob's environment says of him counts for nothing.
	cmd := exec.Command(d.den, "ls", "--json")
	cmd.Env = []string{"DEN_SOCKET=" + d.socket, "DEN_OWNER=den-alice"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: bob.uid, Gid: bob.gid}}
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "[]" {
		t.Errorf("bob with DEN_OWNER=den-alice: %q %v", out, err)
	}
	// The host's sleep is an admin's.
	if _, err := d.runAs(bob, "sleep", "--all"); err == nil || !strings.Contains(stderrOf(err), "admin") {
		t.Errorf("bob: sleep --all: %v", err)
	}

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
