package sshgw

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// agentLike serves sessions the way den's guest agent ends them: exec
// reply, output, EOF, exit-status, close.
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
					time.Sleep(50 * time.Millisecond)
					_ = req.Reply(true, nil)
					var code uint32
					fmt.Sscanf(p.Command, "exit %d", &code)
					go func() {
						io.WriteString(ch, "ok\n")
						ch.CloseWrite()
						_, _ = ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{code}))
						ch.Close()
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

func TestReproOpenSSHMux(t *testing.T) {
	f := newFixture(t, nil)
	f.b.agent = agentLike(t)
	dir, _ := os.MkdirTemp("/tmp", "mx")
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	sg, _ := gossh.NewSignerFromKey(priv)
	f.b.keys[gossh.FingerprintSHA256(sg.PublicKey())] = "alice"
	blk, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "id")
	os.WriteFile(key, pem.EncodeToMemory(blk), 0o600)
	_, port, _ := net.SplitHostPort(f.srv.Addr().String())
	cm := filepath.Join(dir, "cm")
	opts := []string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-p", port, "-o", "ControlPath=" + cm}
	m := exec.Command("ssh", append(opts, "-o", "ControlMaster=yes", "-o", "ControlPersist=60", "-fN", "box@127.0.0.1")...)
	if out, err := m.CombinedOutput(); err != nil {
		t.Fatalf("master: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ssh", append(opts, "-O", "exit", "box@127.0.0.1")...).Run() })
	bad := 0
	for i := 0; i < 20; i++ {
		c := exec.Command("ssh", append(opts, "box@127.0.0.1", "exit 7")...)
		out, _ := c.CombinedOutput()
		if c.ProcessState.ExitCode() != 7 {
			bad++
			t.Logf("run %d: %d %q", i, c.ProcessState.ExitCode(), out)
		}
	}
	if bad > 0 {
		t.Fatalf("%d of 20 wrong", bad)
	}
}
