package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// gw reaches a test daemon's SSH gateway with the real OpenSSH tools.
type gw struct {
	t    *testing.T
	d    *daemon
	port string
	dir  string
}

func newGW(t *testing.T, d *daemon) *gw {
	for _, tool := range []string{"ssh", "scp", "sftp", "ssh-keygen", "ssh-keyscan", "ssh-agent"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (openssh-client): %v", tool, err)
		}
	}
	var info struct{ Gateway, Fingerprint string }
	if err := json.Unmarshal([]byte(d.must("info", "--gateway", "--json")), &info); err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(info.Gateway)
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("gateway address %q: %v", info.Gateway, err)
	}
	// The host key the gateway shows is the one den info reports.
	scan, err := exec.Command("ssh-keyscan", "-t", "ed25519", "-p", port, "127.0.0.1").Output()
	if err != nil {
		t.Fatalf("ssh-keyscan: %v", err)
	}
	kg := exec.Command("ssh-keygen", "-lf", "-")
	kg.Stdin = bytes.NewReader(scan)
	fp, err := kg.Output()
	if err != nil || !strings.Contains(string(fp), info.Fingerprint) || !strings.HasPrefix(info.Fingerprint, "SHA256:") {
		t.Fatalf("host key %q (%v), den info says %q", fp, err, info.Fingerprint)
	}
	return &gw{t: t, d: d, port: port, dir: t.TempDir()}
}

// key makes an ed25519 key pair and returns the private key's path.
func (g *gw) key(name string) string {
	g.t.Helper()
	p := filepath.Join(g.dir, name)
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name+"@test", "-f", p).CombinedOutput(); err != nil {
		g.t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	return p
}

// opts are the OpenSSH options every tool gets: no user config, no
// agent, no prompts, only this key.
func (g *gw) opts(key string) []string {
	return []string{"-F", "/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-i", key}
}

func (g *gw) sshCmd(ctx context.Context, key string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ssh", append(append(g.opts(key), "-p", g.port), args...)...)
}

// ssh runs ssh and returns stdout, stderr and the exit status.
func (g *gw) ssh(key string, stdin []byte, args ...string) (string, string, int) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return runTool(g.t, g.sshCmd(ctx, key, args...), stdin)
}

func runTool(t testing.TB, cmd *exec.Cmd, stdin []byte) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", cmd.Args[0], err)
	}
	return out.String(), errb.String(), code
}

// lineReader returns expect(prefix), which waits for a line that starts
// with prefix.
func lineReader(t *testing.T, r io.Reader) func(string) {
	lines := make(chan string, 100)
	go func() {
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadString('\n')
			lines <- strings.TrimSpace(line)
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	return func(want string) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("session ended before %q", want)
				}
				if strings.HasPrefix(line, want) {
					return
				}
			case <-deadline:
				t.Fatalf("no line %q within 60s", want)
			}
		}
	}
}

// checkPTYSession drives an interactive shell started by cmd on a
// pseudo-terminal: the guest side is a pts of the terminal's size, a
// resize reaches it, and the shell's exit status becomes cmd's.
func checkPTYSession(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	expect := lineReader(t, ptmx)
	io.WriteString(ptmx, "tty | sed 's/^/TTY:/'; stty size\n")
	expect("TTY:/dev/pts/")
	expect("40 100")
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 50, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // SIGWINCH -> window-change -> guest
	io.WriteString(ptmx, "stty size\n")
	expect("50 120")
	io.WriteString(ptmx, "exit 3\n")
	if err := waitCmd(cmd, time.Minute); exitOf(err) != 3 {
		t.Fatalf("%s exit: %v, want status 3", cmd.Path, err)
	}
}

func exitOf(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// freePort is a loopback port nothing listens on now.
func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
