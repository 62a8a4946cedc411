//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	gossh "golang.org/x/crypto/ssh"
)

// TestPID1InNamespaces runs den-agent as init: PID 1 of new PID, mount,
// UTS and network namespaces, chrooted into a tmpfs root (so that the
// final "remount / read-only" and unmounts touch only that). It checks
// the API mounts, serving, orphan reaping, and the poweroff sequence,
// whose reboot(2) in a PID namespace ends just that namespace.
func TestPID1InNamespaces(t *testing.T) {
	ctx, dir, bin := namespaceAgent(t)
	_, signer, _ := agent.NewEd25519Key("test-host")
	os.WriteFile(filepath.Join(dir, "authorized_keys"), gossh.MarshalAuthorizedKey(signer.PublicKey()), 0o644)
	sockDir := filepath.Join(dir, "sock")
	os.Mkdir(sockDir, 0o755)
	root := filepath.Join(dir, "root")
	script := `set -e
R=` + root + `
mkdir -p $R && mount -t tmpfs -o size=64m none $R
for d in bin sbin lib lib64 lib32 libx32; do if [ -L /$d ]; then cp -a /$d $R/$d; fi; done
mkdir -p $R/usr $R/sock $R/etc/den $R/dev $R/root
mount --bind /usr $R/usr && mount -o remount,bind,ro $R/usr
mount --bind ` + sockDir + ` $R/sock
cp /etc/passwd /etc/group $R/etc/ && cp ` + filepath.Join(dir, "authorized_keys") + ` $R/etc/den/
# A /dev of our own: no /dev/console, so the log goes to stderr.
mount -t tmpfs -o mode=755 none $R/dev
mknod -m 666 $R/dev/null c 1 3; mknod -m 666 $R/dev/zero c 1 5
mknod -m 666 $R/dev/urandom c 1 9; mknod -m 666 $R/dev/ptmx c 5 2
cp ` + bin + ` $R/den-agent
exec chroot $R /den-agent -- --no-vsock --no-serial --unix /sock/agent.sock
`
	cmd := exec.CommandContext(ctx, "unshare", "-p", "-f", "-m", "-u", "-n", "--propagation", "private", "sh", "-c", script)
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sock := filepath.Join(sockDir, "agent.sock")
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	c, info, err := agent.WaitReady(wctx, func(ctx context.Context) (net.Conn, error) {
		select {
		case err := <-exited:
			wcancel()
			return nil, fmt.Errorf("init exited early: %v", err)
		default:
		}
		return net.Dial("unix", sock)
	}, signer)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	defer c.Close()
	if !info.PID1 {
		t.Errorf("ready: %+v", info)
	}
	var stdout bytes.Buffer
	script2 := `echo pid=$$; mount | grep -c -E ' on /(proc|sys|dev/pts|dev/shm|run|tmp) ' ; sleep 0.1 & exit 0`
	if code, err := c.Exec(ctx, agent.ExecRequest{CmdLine: script2, Stdout: &stdout}); err != nil || code != 0 {
		t.Fatalf("exec: %d %v", code, err)
	}
	if s := stdout.String(); !strings.Contains(s, "\n6\n") {
		t.Errorf("API mounts: %q", s)
	}
	time.Sleep(500 * time.Millisecond)
	stdout.Reset()
	c.Exec(ctx, agent.ExecRequest{CmdLine: `grep -l '^[0-9]* ([^)]*) Z' /proc/[0-9]*/stat | wc -l`, Stdout: &stdout})
	if strings.TrimSpace(stdout.String()) != "0" {
		t.Errorf("zombies left: %q", stdout.String())
	}
	if err := c.Poweroff(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("init did not power off:\n%s", out.String())
	}
	if s := out.String(); !strings.Contains(s, "system power off") {
		t.Errorf("no power off in the log:\n%s", s)
	}
	t.Logf("init's log:\n%s", out.String())
}

func buildAgent(ctx context.Context, t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "den-agent")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}
