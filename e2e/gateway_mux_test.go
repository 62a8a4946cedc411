package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// TestGatewayMux: OpenSSH's shared connections (ControlMaster, which
// Ansible and most deployment tools use) through the gateway get each
// command's own exit status, and the gateway's limits hold (issue 17).
func TestGatewayMux(t *testing.T) {
	d := startDaemon(t)
	g := newGW(t, d)
	key := g.key("alice")
	d.must("keys", "add", key+".pub")
	d.must("create", "box", "--image", "debian", "--memory", "256M") // Ansible's modules need python3
	const vm = "box@127.0.0.1"

	// Control sockets need a short path (108 bytes).
	sockDir, err := os.MkdirTemp("", "den-mux")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cm := filepath.Join(sockDir, "cm")
	shared := []string{"-o", "ControlPath=" + cm, "-o", "ControlMaster=no"}
	if out, errs, code := g.ssh(key, nil, "-o", "ControlPath="+cm, "-o", "ControlMaster=yes", "-o", "ControlPersist=600", "-fN", vm); code != 0 {
		t.Fatalf("ssh master: %d %q %q", code, out, errs)
	}
	t.Cleanup(func() { g.ssh(key, nil, "-o", "ControlPath="+cm, "-O", "exit", vm) })
	if _, errs, code := g.ssh(key, nil, "-o", "ControlPath="+cm, "-O", "check", vm); code != 0 {
		t.Fatalf("no master: %q", errs)
	}
	// sshShared runs a command over the shared connection, stdin at EOF
	// (/dev/null).
	sshShared := func(cmd string) (string, string, int) {
		return g.ssh(key, nil, append(append([]string{}, shared...), vm, cmd)...)
	}

	t.Run("exit 7, stdin at EOF", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			if out, errs, code := sshShared("echo ok; exit 7"); out != "ok\n" || code != 7 {
				t.Fatalf("run %d of 20: exit %d, out %q, err %q; want 7", i+1, code, out, errs)
			}
		}
		// And with stdin that has data, and plain (not shared).
		if out, _, code := g.ssh(key, []byte("in\n"), append(append([]string{}, shared...), vm, "cat; exit 7")...); out != "in\n" || code != 7 {
			t.Fatalf("with stdin: %q %d", out, code)
		}
		if out, _, code := g.ssh(key, nil, vm, "echo ok; exit 7"); out != "ok\n" || code != 7 {
			t.Fatalf("plain: %q %d", out, code)
		}
	})

	t.Run("100 concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 10)
		errc := make(chan string, 100)
		for i := 0; i < 100; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				want := i % 11 // 0..10, 0 and 1 among them
				out, errs, code := sshShared(fmt.Sprintf("echo %d; exit %d", i, want))
				if code != want || out != fmt.Sprintf("%d\n", i) {
					errc <- fmt.Sprintf("command %d: exit %d (want %d), out %q, err %q", i, code, want, out, errs)
				}
			}()
		}
		wg.Wait()
		close(errc)
		for e := range errc {
			t.Error(e)
		}
	})

	t.Run("sftp, pty and a signal", func(t *testing.T) {
		data := make([]byte, 256<<10+3)
		rand.Read(data)
		local := filepath.Join(g.dir, "mux.bin")
		if err := os.WriteFile(local, data, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		batch := fmt.Sprintf("put %s /root/mux.bin\nget /root/mux.bin %s\n", local, local+".back")
		sftp := exec.CommandContext(ctx, "sftp", append(append(append(g.opts(key), shared...), "-P", g.port, "-b", "-"), vm)...)
		if _, errs, code := runTool(t, sftp, []byte(batch)); code != 0 {
			t.Fatalf("sftp: %d %s", code, errs)
		}
		if back, _ := os.ReadFile(local + ".back"); !bytes.Equal(back, data) {
			t.Fatal("sftp over the shared connection: the file came back different")
		}
		// A command on a pseudo-terminal (-tt), with its exit status.
		out, errs, code := g.ssh(key, nil, append(append([]string{"-tt"}, shared...), vm, "tty | sed 's/^/TTY:/'; exit 3")...)
		if !strings.HasPrefix(out, "TTY:/dev/pts/") || code != 3 {
			t.Fatalf("-tt: exit %d, out %q, err %q", code, out, errs)
		}
		// A command killed by a signal: exit-signal, stdin at EOF.
		c := goClient(t, g, key)
		defer c.Close()
		for i := 0; i < 5; i++ {
			s, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			err = s.Run("echo dying; kill -KILL $$")
			s.Close()
			var ee *gossh.ExitError
			if !errors.As(err, &ee) || ee.Signal() != "KILL" {
				t.Fatalf("run %d: %v, want exit-signal KILL", i, err)
			}
		}
	})

	t.Run("64 KiB user name", func(t *testing.T) {
		long := "box" + strings.Repeat("x", 64<<10)
		// OpenSSH shows a banner at LogLevel INFO (the first -o wins).
		var opts []string
		for _, o := range g.opts(key) {
			if o == "LogLevel=ERROR" {
				o = "LogLevel=INFO"
			}
			opts = append(opts, o)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, errs, code := runTool(t, exec.CommandContext(ctx, "ssh", append(opts, "-p", g.port, "-l", long, "127.0.0.1", "true")...), nil)
		var banner string
		for _, line := range strings.Split(errs, "\n") {
			if strings.HasPrefix(line, "den: ") {
				banner = strings.TrimSpace(line)
			}
		}
		// (OpenSSH's own "USER@host: Permission denied" repeats the name.)
		if code != 255 || !strings.Contains(banner, "user name is too long (65539 bytes; the limit is 256)") || len(banner) > 200 {
			if len(errs) > 300 {
				errs = errs[:150] + " ... " + errs[len(errs)-150:]
			}
			t.Fatalf("exit %d, banner %q, stderr %q", code, banner, errs)
		}
		log, _ := os.ReadFile(d.logPath)
		if strings.Contains(string(log), strings.Repeat("x", 100)) || !strings.Contains(string(log), "user name too long") {
			t.Fatalf("daemon log: the name logged whole, or not at all")
		}
		// The shared connection is still served.
		if out, _, code := sshShared("echo still; exit 3"); out != "still\n" || code != 3 {
			t.Fatalf("after: %q %d", out, code)
		}
	})

	t.Run("channels per connection", func(t *testing.T) {
		c := goClient(t, g, key)
		defer c.Close()
		var open []gossh.Channel
		for i := 0; i < 64; i++ {
			ch, reqs, err := c.OpenChannel("session", nil)
			if err != nil {
				t.Fatalf("channel %d of 64: %v", i+1, err)
			}
			go gossh.DiscardRequests(reqs)
			open = append(open, ch)
		}
		for i := 0; i < 1000; i++ {
			_, _, err := c.OpenChannel("session", nil)
			var oce *gossh.OpenChannelError
			if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, "the limit is 64") {
				t.Fatalf("channel %d over the cap: %v", i+1, err)
			}
		}
		// Other clients are served meanwhile.
		if out, _, code := sshShared("echo other; exit 4"); out != "other\n" || code != 4 {
			t.Fatalf("other client: %q %d", out, code)
		}
		for _, ch := range open {
			ch.Close()
		}
		var err error
		if !eventually(time.Minute, func() bool {
			var s *gossh.Session
			if s, err = c.NewSession(); err != nil {
				return false
			}
			defer s.Close()
			out, oerr := s.Output("echo room")
			err = oerr
			return err == nil && string(out) == "room\n"
		}) {
			t.Fatalf("no channel after closing: %v", err)
		}
	})

	t.Run("ansible", func(t *testing.T) { gatewayAnsible(t, g, key) })
}

// goClient is an x/crypto/ssh client of the gateway for VM box.
func goClient(t *testing.T, g *gw, keyPath string) *gossh.Client {
	t.Helper()
	pem, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gossh.Dial("tcp", "127.0.0.1:"+g.port, &gossh.ClientConfig{
		User: "box", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gatewayAnsible runs an Ansible ad-hoc command and a playbook with a
// task that fails on purpose, over Ansible's own shared connection
// (ControlMaster=auto, ControlPersist), and checks what it reports.
func gatewayAnsible(t *testing.T, g *gw, key string) {
	for _, tool := range []string{"ansible", "ansible-playbook"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (Debian package ansible-core, in make deps): %v", tool, err)
		}
	}
	dir := t.TempDir()
	cpDir, err := os.MkdirTemp("", "den-acp") // control sockets: a short path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		socks, _ := filepath.Glob(filepath.Join(cpDir, "*"))
		for _, s := range socks {
			_ = exec.Command("ssh", "-o", "ControlPath="+s, "-O", "exit", "box").Run()
		}
		os.RemoveAll(cpDir)
	})
	// The SSH user is the VM's name, not a guest account: Ansible's
	// default remote tmp (~USER/.ansible/tmp) would not expand.
	inv := filepath.Join(dir, "inventory")
	write := func(path, text string) {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(inv, fmt.Sprintf("box ansible_host=127.0.0.1 ansible_port=%s ansible_user=box ansible_ssh_private_key_file=%s ansible_python_interpreter=/usr/bin/python3 ansible_remote_tmp=/tmp/.ansible-tmp\n", g.port, key))
	play := filepath.Join(dir, "play.yml")
	write(play, `- hosts: all
  gather_facts: false
  tasks:
    - name: hello
      command: echo hello
      register: hello
    - name: fails on purpose, ignored
      shell: echo bad; exit 3
      register: bad
      ignore_errors: true
    - name: check what was reported
      assert:
        that:
          - hello.stdout == "hello"
          - hello.rc == 0
          - bad.rc == 3
          - bad.stdout == "bad"
          - bad is failed
    - name: fails on purpose
      command: /bin/false
    - name: never runs
      command: echo unreachable
`)
	env := append(os.Environ(),
		"ANSIBLE_HOST_KEY_CHECKING=False",
		"ANSIBLE_SSH_ARGS=-F /dev/null -o ControlMaster=auto -o ControlPersist=120s -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o BatchMode=yes",
		"ANSIBLE_SSH_CONTROL_PATH_DIR="+cpDir,
		"ANSIBLE_LOCAL_TEMP="+filepath.Join(dir, "tmp"),
		"ANSIBLE_NOCOLOR=1", "ANSIBLE_FORCE_COLOR=0", "ANSIBLE_RETRY_FILES_ENABLED=False",
		"ANSIBLE_TIMEOUT=120",
	)
	ansible := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env, cmd.Dir = env, dir
		out, errs, code := runTool(t, cmd, nil)
		return out + errs, code
	}

	out, code := ansible("ansible", "all", "-i", inv, "-m", "command", "-a", "echo adhoc-ok")
	if code != 0 || !regexp.MustCompile(`box \| CHANGED \| rc=0 >>\s*adhoc-ok`).MatchString(out) {
		t.Fatalf("ad-hoc: exit %d\n%s", code, out)
	}
	out, code = ansible("ansible", "all", "-i", inv, "-m", "shell", "-a", "echo adhoc-bad; exit 5")
	if code != 2 || !regexp.MustCompile(`box \| FAILED \| rc=5 >>\s*adhoc-bad`).MatchString(out) {
		t.Fatalf("ad-hoc failing: exit %d\n%s", code, out)
	}
	// The shared connection is Ansible's: its master is still up.
	socks, _ := filepath.Glob(filepath.Join(cpDir, "*"))
	if len(socks) != 1 {
		t.Fatalf("control sockets: %q", socks)
	}

	out, code = ansible("ansible-playbook", "-i", inv, play)
	recap := regexp.MustCompile(`box\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)`).FindStringSubmatch(out)
	// ok: hello, the ignored failure, the assert; failed: /bin/false;
	// ignored: the first failure; the last task never runs.
	if code != 2 || recap == nil || recap[1] != "3" || recap[3] != "0" || recap[4] != "1" || recap[7] != "1" || strings.Contains(out, "never runs") {
		t.Fatalf("playbook: exit %d, recap %q\n%s", code, recap, out)
	}
	if !strings.Contains(out, `"bad"`) || !strings.Contains(out, `"rc": 3`) {
		t.Fatalf("playbook: the ignored failure not reported\n%s", out)
	}
}
