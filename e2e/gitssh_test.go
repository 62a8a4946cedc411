package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/netns"
)

// Bounds of the git server: a connection lives at most gitConnLimit (its
// handshake gitHandshakeLimit), a git-receive-pack or git-upload-pack run
// at most gitRunLimit.
const (
	gitHandshakeLimit = 30 * time.Second
	gitRunLimit       = 2 * time.Minute
	gitConnLimit      = gitRunLimit + time.Minute
)

// gitServer is a git server over SSH in a test namespace: it accepts one
// public key, and runs git-receive-pack / git-upload-pack on bare
// repositories under its directory.
type gitServer struct {
	HostKey gossh.PublicKey // its host key (ed25519), for known_hosts lines
	Dir     string          // the bare repositories' parent directory

	pushes atomic.Int64 // successful git-receive-pack runs
	cfg    *gossh.ServerConfig
	ctx    context.Context // done when the test ends
	wg     sync.WaitGroup  // the server's goroutines
}

// serveGitSSH starts it on addr (ip:port) inside namespace ns, accepting only
// the public key allowed; it creates an empty bare repository Dir/repo.git.
func (n *testNet) serveGitSSH(t *testing.T, ns, addr string, allowed gossh.PublicKey) *gitServer {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsUnspecified() {
		t.Fatalf("git server: listen on %q: want a specific ip:port", addr)
	}
	ln, err := netns.Listen(ns, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return serveGit(t, ln, allowed)
}

// serveGit serves git over SSH on ln until the test ends (ln is closed
// then), accepting only the public key allowed.
func serveGit(t testing.TB, ln net.Listener, allowed gossh.PublicKey) *gitServer {
	t.Helper()
	g := &gitServer{Dir: t.TempDir()}
	gitInitBare(t, filepath.Join(g.Dir, "repo.git"))
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	g.HostKey = signer.PublicKey()
	want := allowed.Marshal()
	g.cfg = &gossh.ServerConfig{PublicKeyCallback: func(_ gossh.ConnMetadata, key gossh.PublicKey) (*gossh.Permissions, error) {
		if !bytes.Equal(key.Marshal(), want) {
			return nil, fmt.Errorf("git server: key %s not allowed", gossh.FingerprintSHA256(key))
		}
		return &gossh.Permissions{}, nil
	}}
	g.cfg.AddHostKey(signer)
	ctx, cancel := context.WithCancel(context.Background())
	g.ctx = ctx
	g.wg.Go(func() { g.accept(ln) })
	// Registered after t.TempDir: runs before Dir is removed.
	t.Cleanup(func() {
		cancel()
		ln.Close()
		done := make(chan struct{})
		go func() { g.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("git server: goroutines still running 30s after the test")
		}
	})
	return g
}

// gitInitBare makes an empty bare repository at dir.
func gitInitBare(t testing.TB, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "git", "init", "-q", "--bare", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init --bare %s: %v: %s", dir, err, out)
	}
}

// Pushes returns how many pushes succeeded so far.
func (g *gitServer) Pushes() int { return int(g.pushes.Load()) }

// KnownHostsLine returns "NAME ssh-ed25519 AAAA..." for known_hosts.
func (g *gitServer) KnownHostsLine(name string) string {
	return name + " " + strings.TrimSpace(string(gossh.MarshalAuthorizedKey(g.HostKey)))
}

// accept serves each connection on ln until ln is closed.
func (g *gitServer) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		g.wg.Go(func() { g.conn(c) })
	}
}

// conn serves one connection, for at most gitConnLimit and no longer than
// the test.
func (g *gitServer) conn(c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(g.ctx, func() { c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(gitHandshakeLimit))
	sc, chans, reqs, err := gossh.NewServerConn(c, g.cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	_ = c.SetDeadline(time.Now().Add(gitConnLimit))
	g.wg.Go(func() { gossh.DiscardRequests(reqs) })
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(gossh.UnknownChannelType, "only sessions")
			continue
		}
		g.wg.Go(func() { g.session(nc) })
	}
}

// session serves one session channel: its first exec runs git, then the
// channel ends.
func (g *gitServer) session(nc gossh.NewChannel) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "env":
			_ = req.Reply(true, nil)
		case "exec":
			var p struct{ Command string }
			if err := gossh.Unmarshal(req.Payload, &p); err != nil {
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, nil)
			g.wg.Go(func() { gossh.DiscardRequests(reqs) })
			code := g.run(ch, p.Command)
			_ = ch.CloseWrite()
			_, _ = ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{code}))
			return
		default:
			_ = req.Reply(false, nil)
		}
	}
}

// run runs the git command the client asked for on ch, and returns its
// exit status.
func (g *gitServer) run(ch gossh.Channel, command string) uint32 {
	prog, repo, err := parseGitCommand(command)
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "%v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(g.ctx, gitRunLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, filepath.Join(g.Dir, repo))
	cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "git server: %s: %v\n", prog, err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(ch.Stderr(), "git server: %s: %v\n", prog, err)
		return 1
	}
	// Not waited for by Wait: it ends at the client's EOF, or when the
	// channel is closed after the exit status.
	g.wg.Go(func() {
		_, _ = io.Copy(stdin, ch)
		stdin.Close()
	})
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		if prog == "git-receive-pack" {
			g.pushes.Add(1)
		}
		return 0
	case errors.As(err, &ee) && ee.ExitCode() > 0:
		return uint32(ee.ExitCode())
	default:
		fmt.Fprintf(ch.Stderr(), "git server: %s: %v\n", prog, err)
		return 1
	}
}

// parseGitCommand splits an exec command such as "git-receive-pack
// '/repo.git'" into the program and the repository's name: one path
// element, quoted or not, with a leading slash or not.
func parseGitCommand(command string) (prog, repo string, err error) {
	prog, arg, _ := strings.Cut(strings.TrimSpace(command), " ")
	if prog != "git-receive-pack" && prog != "git-upload-pack" {
		return "", "", fmt.Errorf("git server: command %q refused: only git-receive-pack and git-upload-pack", command)
	}
	arg = strings.TrimSpace(arg)
	if len(arg) >= 2 && arg[0] == '\'' && arg[len(arg)-1] == '\'' {
		arg = arg[1 : len(arg)-1]
	}
	repo = strings.TrimPrefix(arg, "/")
	if repo == "" || repo == "." || repo == ".." || strings.ContainsAny(repo, "/\\'\x00") {
		return "", "", fmt.Errorf("git server: repository %q refused: want one name under the server's directory", arg)
	}
	return prog, repo, nil
}

func TestGitSSHServer(t *testing.T) {
	for _, bin := range []string{"ssh", "git", "git-receive-pack", "git-upload-pack"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s on PATH: %v", bin, err)
		}
	}
	dir := t.TempDir()
	key := clientKey(t, filepath.Join(dir, "id_ed25519"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	g := serveGit(t, ln, key.PublicKey())
	port := ln.Addr().(*net.TCPAddr).Port

	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(g.KnownHostsLine(fmt.Sprintf("[127.0.0.1]:%d", port))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	env := append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_SSH_COMMAND=ssh -F /dev/null -i "+filepath.Join(dir, "id_ed25519")+" -o UserKnownHostsFile="+kh+
			" -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o BatchMode=yes")
	git := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", work)
	if err := os.WriteFile(filepath.Join(work, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("-C", work, "add", "hello.txt")
	git("-C", work, "-c", "user.name=Test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "hello")
	head := git("-C", work, "rev-parse", "HEAD")
	git("-C", work, "push", "-q", fmt.Sprintf("ssh://git@127.0.0.1:%d/repo.git", port), "HEAD:refs/heads/main")

	if n := g.Pushes(); n != 1 {
		t.Errorf("pushes: %d, want 1", n)
	}
	if got := git("--git-dir", filepath.Join(g.Dir, "repo.git"), "rev-parse", "refs/heads/main"); got != head {
		t.Errorf("server's main: %s, pushed %s", got, head)
	}
	// A fetch runs git-upload-pack (not a push).
	git("-C", work, "fetch", "-q", fmt.Sprintf("ssh://git@127.0.0.1:%d/repo.git", port), "main")
	if n := g.Pushes(); n != 1 {
		t.Errorf("pushes after a fetch: %d, want 1", n)
	}

	// Refused: another key, and a path outside Dir.
	other := clientKey(t, filepath.Join(dir, "other"))
	if c, err := gitSSHDial(ln.Addr().String(), other); err == nil {
		c.Close()
		t.Error("git server accepted a key it was not given")
	}
	c, err := gitSSHDial(ln.Addr().String(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stderr bytes.Buffer
	s.Stderr = &stderr
	err = s.Run("git-receive-pack '../repo.git'")
	var ee *gossh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 1 || !strings.Contains(stderr.String(), "refused") {
		t.Errorf("push to ../repo.git: %v, stderr %q; want exit status 1, refused", err, stderr.String())
	}
	if n := g.Pushes(); n != 1 {
		t.Errorf("pushes after a refused one: %d, want 1", n)
	}
}

// clientKey makes an ed25519 key, writes its private half (OpenSSH PEM)
// to path with mode 0600, and returns it.
func clientKey(t *testing.T, path string) gossh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

// gitSSHDial connects to the git server at addr with key.
func gitSSHDial(addr string, key gossh.Signer) (*gossh.Client, error) {
	return gossh.Dial("tcp", addr, &gossh.ClientConfig{
		User:            "git",
		Auth:            []gossh.AuthMethod{gossh.PublicKeys(key)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(),
		Timeout:         10 * time.Second,
	})
}
