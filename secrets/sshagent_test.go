package secrets

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func newKey(t *testing.T) (ssh.Signer, []byte) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, pem.EncodeToMemory(blk)
}

// sshServer accepts the user key accept and runs nothing: an exec
// request answers exit status 0. It listens on 127.0.0.1.
func sshServer(t *testing.T, host ssh.Signer, accept func() ssh.PublicKey) string {
	t.Helper()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), accept().Marshal()) {
			return nil, nil
		}
		return nil, errors.New("not this key")
	}}
	cfg.AddHostKey(host)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				_, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, creqs, err := nc.Accept()
					if err != nil {
						return
					}
					for r := range creqs {
						r.Reply(r.Type == "exec", nil)
						if r.Type == "exec" {
							ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
							ch.Close()
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestSSHAgent: the real OpenSSH client logs in with a secret held by
// the store, through ServeSSHAgent, to the destination the secret names;
// not to another host; not after a revoke; a later VM of the same name
// sees no key, and a new value counts at once.
func TestSSHAgent(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("no OpenSSH client (apt-get install openssh-client)")
	}
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	userKey, pemKey := newKey(t)
	var mu sync.Mutex
	want := userKey.PublicKey()
	accept := func() ssh.PublicKey { mu.Lock(); defer mu.Unlock(); return want }
	goodHost, _ := newKey(t)
	otherHost, _ := newKey(t)
	good := sshServer(t, goodHost, accept)
	other := sshServer(t, otherHost, accept)
	line := func(addr string, k ssh.Signer) string {
		h, p, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("[%s]:%s %s", h, p, ssh.MarshalAuthorizedKey(k.PublicKey()))
	}
	if _, err := s.AddSSH("alice", "deploy", pemKey, line(good, goodHost)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddSSH("alice", "deploy", pemKey, line(good, goodHost)); !errors.Is(err, ErrExists) {
		t.Fatalf("a second add: %v", err)
	}
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(line(good, goodHost)+line(other, otherHost)), 0o600); err != nil {
		t.Fatal(err)
	}
	box := VMRef{Name: "box", Created: time.Now()}
	if err := s.Grant("alice", "deploy", box); err != nil {
		t.Fatal(err)
	}

	var uses []Use
	serve := func(vm VMRef) string {
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					s.ServeSSHAgent(c, vm, func(u Use) { mu.Lock(); uses = append(uses, u); mu.Unlock() })
				}()
			}
		}()
		return sock
	}
	sock := serve(box)
	login := func(sock, addr string) error {
		h, p, _ := net.SplitHostPort(addr)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ssh", "-F", "none", "-p", p, "-o", "UserKnownHostsFile="+kh, "-o", "StrictHostKeyChecking=yes",
			"-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "git@"+h, "true")
		cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := login(sock, good); err != nil {
		t.Fatalf("login to the secret's destination: %v", err)
	}
	if err := login(sock, other); err == nil {
		t.Fatal("the secret signed for a host it does not name")
	}
	mu.Lock()
	if len(uses) < 2 || uses[0].Err != nil || uses[len(uses)-1].Err == nil || !strings.Contains(uses[len(uses)-1].Err.Error(), "not for the host") {
		t.Errorf("uses: %+v", uses)
	}
	mu.Unlock()

	// A new value counts at once.
	newUser, newPEM := newKey(t)
	mu.Lock()
	want = newUser.PublicKey()
	mu.Unlock()
	if _, err := s.Set("alice", "deploy", newPEM); err != nil {
		t.Fatal(err)
	}
	if err := login(sock, good); err != nil {
		t.Fatalf("login after a new value: %v", err)
	}
	// A VM of the same name made later has no grant.
	if err := login(serve(VMRef{Name: "box", Created: box.Created.Add(time.Second)}), good); err == nil {
		t.Fatal("a later vm of the same name used the grant")
	}
	if ok, err := s.Revoke("alice", "deploy", box); err != nil || !ok {
		t.Fatalf("revoke: %v %v", ok, err)
	}
	if err := login(sock, good); err == nil {
		t.Fatal("a revoked grant still signs")
	}
}

// TestStore: values are encrypted at rest; bad keys, names and
// known_hosts are refused in one line; remove takes the grants along.
func TestStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	host, _ := newKey(t)
	_, pemKey := newKey(t)
	kh := "git.test " + string(ssh.MarshalAuthorizedKey(host.PublicKey()))
	sec, err := s.AddSSH("alice", "deploy", pemKey, kh)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Hosts) != 1 || sec.Hosts[0] != "git.test" || !strings.HasPrefix(sec.PublicKey, "ssh-ed25519 ") {
		t.Errorf("secret %+v", sec)
	}
	b, err := os.ReadFile(s.path("alice", "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Split(string(pemKey), "\n")[1]
	if bytes.Contains(b, []byte(body)) || bytes.Contains(b, []byte("OPENSSH")) {
		t.Error("the value is in the clear on disk")
	}
	// Reopened with the same key: readable.
	s2, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s2.List("alice"); err != nil || len(l) != 1 || l[0].Name != "deploy" {
		t.Fatalf("list after reopening: %+v %v", l, err)
	}
	for _, c := range []struct{ name, key, kh string }{
		{"bad/name", string(pemKey), kh}, {"ok", "not a key", kh}, {"ok", string(pemKey), "no host key here"},
	} {
		if _, err := s.AddSSH("alice", c.name, []byte(c.key), c.kh); !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
			t.Errorf("add %q: %v", c.name, err)
		}
	}
	vm := VMRef{Name: "box", Created: time.Now()}
	if err := s.Grant("alice", "nosuch", vm); !errors.Is(err, ErrNotFound) {
		t.Errorf("grant of a missing secret: %v", err)
	}
	if err := s.Grant("alice", "deploy", vm); err != nil {
		t.Fatal(err)
	}
	fork := VMRef{Name: "fork", Created: time.Now().Add(time.Second)}
	if err := s.CopyGrants(vm, fork, "bob"); err != nil {
		t.Fatal(err)
	}
	if gs, _ := s.Grants(fork); len(gs) != 0 {
		t.Errorf("another user's grants copied: %+v", gs)
	}
	if err := s.CopyGrants(vm, fork, "alice"); err != nil {
		t.Fatal(err)
	}
	if gs, _ := s.Grants(fork); len(gs) != 1 {
		t.Errorf("copied grants: %+v", gs)
	}
	if err := s.Remove("alice", "deploy"); err != nil {
		t.Fatal(err)
	}
	if gs, _ := s.Grants(vm); len(gs) != 0 {
		t.Errorf("grants after remove: %+v", gs)
	}
	if _, err := s.Get("alice", "deploy"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after remove: %v", err)
	}
}

// TestSignOnlyLogin: in a bound session, den signs the session's own
// public key login request with the key, and nothing else: not other
// data, not another session's login, not a login with another key, not
// for a host the secret does not name.
func TestSignOnlyLogin(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "store"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	user, pemKey := newKey(t)
	host, _ := newKey(t)
	other, _ := newKey(t)
	if _, err := s.AddSSH("alice", "deploy", pemKey, "git.test "+string(ssh.MarshalAuthorizedKey(host.PublicKey()))); err != nil {
		t.Fatal(err)
	}
	vm := VMRef{Name: "box", Created: time.Now()}
	if err := s.Grant("alice", "deploy", vm); err != nil {
		t.Fatal(err)
	}
	login := func(session []byte, key ssh.PublicKey) []byte {
		return ssh.Marshal(struct {
			Session               []byte
			Type                  byte
			User, Service, Method string
			Signed                bool
			Algo                  string
			Key                   []byte
		}{session, 50, "git", "ssh-connection", "publickey", true, key.Type(), key.Marshal()})
	}
	bind := func(a *vmAgent, h ssh.Signer, session []byte) {
		sig, err := h.Sign(rand.Reader, session)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Extension(sessionBind, ssh.Marshal(struct {
			HostKey, SessionID, Signature []byte
			Forwarding                    bool
		}{h.PublicKey().Marshal(), session, ssh.Marshal(sig), false})); err != nil {
			t.Fatal(err)
		}
	}
	a := &vmAgent{s: s, vm: vm, note: func(Use) {}}
	if _, err := a.Sign(user.PublicKey(), login([]byte("sid"), user.PublicKey())); err == nil {
		t.Error("signed in an unbound session")
	}
	bind(a, host, []byte("sid"))
	sig, err := a.Sign(user.PublicKey(), login([]byte("sid"), user.PublicKey()))
	if err != nil {
		t.Fatalf("the bound session's login: %v", err)
	}
	if err := user.PublicKey().Verify(login([]byte("sid"), user.PublicKey()), sig); err != nil {
		t.Fatalf("the signature: %v", err)
	}
	for name, data := range map[string][]byte{
		"other data":            []byte("anything at all"),
		"another session":       login([]byte("other"), user.PublicKey()),
		"a login with more":     append(login([]byte("sid"), user.PublicKey()), 0),
		"a login with host key": login([]byte("sid"), host.PublicKey()),
	} {
		if _, err := a.Sign(user.PublicKey(), data); err == nil {
			t.Errorf("%s: signed", name)
		}
	}
	b := &vmAgent{s: s, vm: vm, note: func(Use) {}}
	bind(b, other, []byte("sid"))
	if _, err := b.Sign(user.PublicKey(), login([]byte("sid"), user.PublicKey())); err == nil || !strings.Contains(err.Error(), "not for the host") {
		t.Errorf("a session bound to another host: %v", err)
	}
	bad := &vmAgent{s: s, vm: vm, note: func(Use) {}}
	sig2, _ := other.Sign(rand.Reader, []byte("sid"))
	if _, err := bad.Extension(sessionBind, ssh.Marshal(struct {
		HostKey, SessionID, Signature []byte
		Forwarding                    bool
	}{host.PublicKey().Marshal(), []byte("sid"), ssh.Marshal(sig2), false})); err == nil {
		t.Error("a session-bind whose signature is not the host's was taken")
	}
}
