package sshgw

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// agentLike is a guest agent stand-in that ends "exit N" sessions the way
// den's agent does: the exec reply, output, EOF, exit-status N, close; a
// "wait" session goes on until the client closes it.
func agentLike(t *testing.T) *gossh.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cfg := &gossh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(newSigner(t))
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, chans, reqs, err := gossh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		go gossh.DiscardRequests(reqs)
		for nc := range chans {
			go func() {
				ch, reqs, err := nc.Accept()
				if err != nil {
					return
				}
				for req := range reqs {
					if req.Type != "exec" {
						_ = req.Reply(false, nil)
						continue
					}
					var p struct{ Command string }
					_ = gossh.Unmarshal(req.Payload, &p)
					_ = req.Reply(true, nil)
					if p.Command == "wait" { // until the client leaves
						continue
					}
					var code uint32
					fmt.Sscanf(p.Command, "exit %d", &code)
					go func() {
						_, _ = io.WriteString(ch, "ok\n")
						_ = ch.CloseWrite()
						_, _ = ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{code}))
						_ = ch.Close()
					}()
				}
			}()
		}
	}()
	cl, err := gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{User: "root", HostKeyCallback: gossh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestOpenSSHControlMaster: OpenSSH's shared connections (ControlMaster)
// get every command's own exit status, with stdin at EOF, one at a time
// and concurrently (the gateway used to lose it: exit 255 for `exit 7`).
func TestOpenSSHControlMaster(t *testing.T) {
	f := newFixture(t, nil)
	f.b.agent = agentLike(t)
	opts, dir := opensshOptions(t, f)
	// Clipped: the commands below append to opts concurrently.
	opts = slices.Clip(append(opts, "-o", "ControlPath="+filepath.Join(dir, "cm")))
	if out, err := exec.Command("ssh", append(opts, "-o", "ControlMaster=yes", "-o", "ControlPersist=60", "-fN", "box@127.0.0.1")...).CombinedOutput(); err != nil {
		t.Fatalf("ssh master: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ssh", append(opts, "-O", "exit", "box@127.0.0.1")...).Run() })
	run := func(code int) (int, string) {
		c := exec.Command("ssh", append(opts, "-o", "ControlMaster=no", "box@127.0.0.1", fmt.Sprintf("exit %d", code))...)
		out, _ := c.CombinedOutput() // stdin: /dev/null
		return c.ProcessState.ExitCode(), string(out)
	}
	for i := 0; i < 20; i++ {
		if got, out := run(7); got != 7 || out != "ok\n" {
			t.Fatalf("run %d: exit %d, output %q; want 7", i, got, out)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10)
	errs := make(chan string, 60)
	for i := 0; i < 60; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if got, out := run(i % 7); got != i%7 {
				errs <- fmt.Sprintf("exit %d: got %d %q", i%7, got, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := f.b.opens.Load(); n != 1 {
		t.Fatalf("%d claims for one shared connection", n)
	}
}

// opensshOptions registers a new key for alice and returns the options
// that make ssh use it against f's gateway (and nothing of the user's
// own configuration), and a short directory removed after the test.
func opensshOptions(t *testing.T, f *fixture) (opts []string, dir string) {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("ssh (openssh-client) not installed")
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sg, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	f.b.keys[gossh.FingerprintSHA256(sg.PublicKey())] = "alice"
	blk, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	dir, err = os.MkdirTemp("", "den-mux") // short: a control socket's path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	key := filepath.Join(dir, "id")
	if err := os.WriteFile(key, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(f.srv.Addr().String())
	return []string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR", "-p", port}, dir
}

// TestOpenSSHRemoteForwardRefused: ssh -R (a port or a unix socket path)
// with ExitOnForwardFailure ends with den's reason and OpenSSH's own
// error, exit 255; without it, the command runs as ever.
func TestOpenSSHRemoteForwardRefused(t *testing.T) {
	f := newFixture(t, nil)
	f.b.agent = agentLike(t)
	opts, dir := opensshOptions(t, f)
	ssh := func(args ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, "ssh", append(opts, args...)...)
		out, _ := c.CombinedOutput() // stdin: /dev/null
		return c.ProcessState.ExitCode(), string(out)
	}
	for _, tc := range []struct{ spec, openssh string }{
		{"8765:127.0.0.1:9", "remote port forwarding failed for listen port 8765"},
		{filepath.Join(dir, "r.sock") + ":127.0.0.1:9", "remote port forwarding failed for listen path " + filepath.Join(dir, "r.sock")},
	} {
		code, out := ssh("-o", "ExitOnForwardFailure=yes", "-R", tc.spec, "box@127.0.0.1", "wait")
		if code != 255 || !strings.Contains(out, remoteForwardRefused) || !strings.Contains(out, tc.openssh) {
			t.Errorf("-R %s: exit %d, output %q", tc.spec, code, out)
		}
	}
	if code, out := ssh("-R", "8765:127.0.0.1:9", "box@127.0.0.1", "exit 7"); code != 7 || !strings.Contains(out, "ok\n") {
		t.Errorf("-R without ExitOnForwardFailure: exit %d, output %q", code, out)
	}
}
