package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
	gossh "golang.org/x/crypto/ssh"
)

// identityChange is a NewIdentity request for a running guest.
type identityChange struct{ hostname, token string }

// guestIdentity is what a booted guest says it is.
type guestIdentity struct {
	hostname, machineID, hostKey, token string
}

// TestGuestIdentityColdBoot boots one disk three times, as a disk-only
// fork does: with den.identity=A, then B (a new VM cold-booting from a
// copy of the first one's disk: new hostname, machine-id and agent host
// key), then B again (the same VM rebooting: nothing changes).
func TestGuestIdentityColdBoot(t *testing.T) {
	if testing.Short() {
		t.Skip("real guest test: boots QEMU (run without -short)")
	}
	testutil.NeedRoot(t, "real guest test")
	if _, err := qemu.FindBinary(); err != nil {
		t.Fatal(err)
	}
	d, err := DefaultDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Check(Minimal); err != nil {
		t.Fatalf("guest images not built (make image): %v", err)
	}
	if !bytes.Contains(cpioFiles(t, d.Initramfs())["init"].data, []byte("den_identity")) {
		t.Fatalf("%s predates den.identity: rebuild it (make image)", d.Initramfs())
	}
	for _, root := range RootDisks {
		t.Run(root, func(t *testing.T) {
			if err := d.Check(root); err != nil {
				if errors.Is(err, ErrNotBuilt) && root != Minimal {
					t.Skipf("%v", err)
				}
				t.Fatal(err)
			}
			testGuestIdentity(t, d, root)
		})
	}
}

func testGuestIdentity(t *testing.T, d Dir, root string) {
	dir, err := os.MkdirTemp("/tmp", "idg") // short paths: unix sockets live here
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	disk := filepath.Join(dir, "disk.raw")
	if err := sparse.Copy(d.RootDisk(root), disk); err != nil {
		t.Fatal(err)
	}
	_, signer, err := agent.NewEd25519Key("test")
	if err != nil {
		t.Fatal(err)
	}
	const (
		tokA = "aaaaaaaaaaaaaaaa0000000000000001"
		tokB = "bbbbbbbbbbbbbbbb0000000000000002"
	)
	initrd := d.Initramfs()
	a := bootIdentity(t, d, initrd, dir, "a", disk, signer, tokA, "one", nil)
	b := bootIdentity(t, d, initrd, dir, "b", disk, signer, tokB, "two", nil)
	c := bootIdentity(t, d, initrd, dir, "c", disk, signer, tokB, "two", nil)
	t.Logf("%s: A %+v", root, a)
	t.Logf("%s: B %+v", root, b)
	if a.hostname != "one" || b.hostname != "two" || c.hostname != "two" {
		t.Errorf("hostnames %q %q %q, want one two two", a.hostname, b.hostname, c.hostname)
	}
	for _, g := range []guestIdentity{a, b, c} {
		if len(g.machineID) != 32 || strings.Trim(g.machineID, "0123456789abcdef") != "" {
			t.Errorf("machine-id %q", g.machineID)
		}
	}
	if a.machineID == b.machineID {
		t.Errorf("den.identity B kept A's machine-id %s", a.machineID)
	}
	if a.hostKey == b.hostKey {
		t.Errorf("den.identity B kept A's agent host key %s", a.hostKey)
	}
	if a.token != tokA || b.token != tokB || c.token != tokB {
		t.Errorf("recorded tokens %q %q %q", a.token, b.token, c.token)
	}
	if c != b {
		t.Errorf("a reboot with the same den.identity changed the identity:\n%+v\n%+v", b, c)
	}

	// A running guest given a new identity (a memory+disk fork) keeps it
	// when it later cold-boots with the same den.identity.
	const tokD = "dddddddddddddddd0000000000000004"
	g := bootIdentity(t, d, initrd, dir, "g", disk, signer, tokB, "two", &identityChange{hostname: "four", token: tokD})
	h := bootIdentity(t, d, initrd, dir, "h", disk, signer, tokD, "four", nil)
	t.Logf("%s: NewIdentity %+v", root, g)
	if g.hostname != "four" || g.token != tokD || g.machineID == c.machineID || g.hostKey == c.hostKey {
		t.Errorf("NewIdentity: %+v after %+v", g, c)
	}
	if h != g {
		t.Errorf("a cold boot with the den.identity given to NewIdentity changed the identity:\n%+v\n%+v", g, h)
	}
	consoles := map[string]bool{"a": true, "b": true, "c": false, "g": false, "h": false}
	for name, want := range consoles {
		log, _ := os.ReadFile(vmm.RunDir(filepath.Join(dir, name)).ConsoleLog())
		if got := bytes.Contains(log, []byte("den-initramfs: new identity for ")); got != want {
			t.Errorf("boot %s: initramfs made a new identity: %v, want %v", name, got, want)
		}
	}
	if root != Minimal {
		return
	}

	// An initramfs that does not apply den.identity (an older one): the
	// agent, as init, does it before it serves.
	old := initramfsWithoutIdentity(t, d, dir)
	e := bootIdentity(t, d, old, dir, "e", disk, signer, tokA, "three", nil)
	t.Logf("%s: agent-made %+v", root, e)
	if e.hostname != "three" || e.token != tokA || e.machineID == c.machineID || e.hostKey == c.hostKey {
		t.Errorf("the agent as init did not make a new identity: %+v after %+v", e, c)
	}
	log, _ := os.ReadFile(vmm.RunDir(filepath.Join(dir, "e")).ConsoleLog())
	if bytes.Contains(log, []byte("den-initramfs: new identity")) || !bytes.Contains(log, []byte("msg=\"new identity\"")) {
		t.Errorf("boot e: want the agent's new identity, not the initramfs's; console:\n%s", log)
	}
	f := bootIdentity(t, d, old, dir, "f", disk, signer, tokA, "three", nil)
	if f != e {
		t.Errorf("the agent changed the identity on a reboot with the same den.identity:\n%+v\n%+v", e, f)
	}
}

// initramfsWithoutIdentity is the image's initramfs with the call of
// den_identity taken out of /init.
func initramfsWithoutIdentity(t *testing.T, d Dir, dir string) string {
	t.Helper()
	tree := filepath.Join(dir, "initramfs")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	sh := func(script string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-ec", script, "sh", d.Initramfs(), tree, filepath.Join(dir, "old-initramfs.img"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	sh(`cd "$2" && gzip -dc "$1" | cpio -idm --quiet`)
	init := filepath.Join(tree, "init")
	data, err := os.ReadFile(init)
	if err != nil {
		t.Fatal(err)
	}
	call := []byte(`den_identity /newroot "$identity" "$hostname"`)
	if !bytes.Contains(data, call) {
		t.Fatalf("/init does not call %s", call)
	}
	if err := os.WriteFile(init, bytes.Replace(data, call, []byte(":"), 1), 0o755); err != nil {
		t.Fatal(err)
	}
	sh(`cd "$2" && find . | cpio -o -H newc --quiet | gzip >"$3"`)
	return filepath.Join(dir, "old-initramfs.img")
}

// bootIdentity boots disk (with the initramfs initrd) with
// den.identity=token den.hostname=host, asks the agent for change if
// it is set, reads the guest's identity through the agent, and powers the
// guest off.
func bootIdentity(t *testing.T, d Dir, initrd, dir, name, disk string, signer gossh.Signer, token, host string, change *identityChange) guestIdentity {
	t.Helper()
	run := vmm.RunDir(filepath.Join(dir, name))
	v := qemu.New(qemu.Options{RunDir: run})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer v.Shutdown(context.Background())
	cfg := vmm.Config{
		CPUs: 1, MemoryBytes: 512 << 20,
		Kernel: d.BzImage(), Initramfs: initrd,
		Cmdline: fmt.Sprintf("console=ttyS0 panic=-1 %s den.hostname=%s den.identity=%s",
			agent.AuthorizedKeyArg(signer.PublicKey()), host, token),
		Disks: []vmm.Disk{{ID: "root", Path: disk}},
	}
	if err := v.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := v.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	var hostKey string
	connect := func() *agent.Client {
		c, _, err := agent.WaitReady(ctx, func(ctx context.Context) (net.Conn, error) {
			return v.DialGuest(ctx, agent.Port)
		}, signer, agent.WithHostKeyCallback(func(_ string, _ net.Addr, k gossh.PublicKey) error {
			hostKey = gossh.FingerprintSHA256(k)
			return nil
		}))
		if err != nil {
			t.Fatalf("boot %s: agent: %v\nconsole:\n%s", name, err, vmm.TailFile(run.ConsoleLog(), 4000))
		}
		return c
	}
	c := connect()
	defer func() { c.Close() }()
	if change != nil {
		// As a memory+disk fork does: a new identity for the running guest.
		bootKey := hostKey
		rep, err := c.NewIdentityToken(ctx, change.hostname, change.token)
		if err != nil {
			t.Fatalf("boot %s: new identity: %v", name, err)
		}
		// The guest channel is one stream: the next connection waits for
		// this one to end.
		c.Close()
		c = connect()
		if hostKey == bootKey || !strings.HasPrefix(rep.HostKey, "ssh-ed25519 ") {
			t.Errorf("boot %s: host key %s after NewIdentity (was %s), reply %q", name, hostKey, bootKey, rep.HostKey)
		}
	}
	var out, errb bytes.Buffer
	code, err := c.Exec(ctx, agent.ExecRequest{
		CmdLine: "hostname; cat /etc/machine-id; cat /etc/den/identity",
		Stdout:  &out, Stderr: &errb,
	})
	if err != nil || code != 0 {
		t.Fatalf("boot %s: exec: %v (exit %d): %s%s", name, err, code, out.String(), errb.String())
	}
	f := strings.Fields(out.String())
	if len(f) != 3 {
		t.Fatalf("boot %s: guest said %q", name, out.String())
	}
	// A clean poweroff, so that the next boot finds the disk as this one
	// left it.
	if err := c.Poweroff(ctx); err != nil {
		t.Fatalf("boot %s: poweroff: %v", name, err)
	}
	select {
	case <-v.Exited():
	case <-time.After(2 * time.Minute):
		t.Fatalf("boot %s: guest still running 2 min after poweroff\nconsole:\n%s", name, vmm.TailFile(run.ConsoleLog(), 4000))
	}
	return guestIdentity{hostname: f[0], machineID: f[1], hostKey: hostKey, token: f[2]}
}
