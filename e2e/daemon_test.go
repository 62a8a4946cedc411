package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestVMLifecycle creates a VM and uses it through every client verb.
func TestVMLifecycle(t *testing.T) {
	d := startDaemon(t)

	var vm vmJSON
	if err := json.Unmarshal([]byte(d.must("create", "box", "--memory", "256M", "--json")), &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Name != "box" || vm.State != "running" || vm.PID == 0 {
		t.Fatalf("created vm: %+v", vm)
	}

	t.Run("exec", func(t *testing.T) {
		if out := d.must("exec", "box", "--", "uname", "-a"); !strings.Contains(out, "Linux box ") {
			t.Fatalf("uname -a: %q", out)
		}
		_, err := d.run("exec", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		if exitCode(err) != 7 || stderrOf(err) != "err" {
			t.Fatalf("exit 7: code %d, err %v", exitCode(err), err)
		}
		out, err := d.runIn([]byte("hello from stdin\n"), "exec", "box", "--", "tr", "a-z", "A-Z")
		if err != nil || out != "HELLO FROM STDIN\n" {
			t.Fatalf("stdin: %q %v", out, err)
		}
		out = d.must("exec", "box", "--env", "GREETING=hi there", "--workdir", "/tmp", "--", "sh", "-c", `echo "$GREETING"; pwd`)
		if out != "hi there\n/tmp\n" {
			t.Fatalf("env and workdir: %q", out)
		}
		// Arguments arrive as given, spaces and quotes included.
		if out := d.must("exec", "box", "--", "printf", "%s|", "a b", `it's`, "$HOME"); out != "a b|it's|$HOME|" {
			t.Fatalf("argument quoting: %q", out)
		}
	})

	t.Run("ssh with a pty", func(t *testing.T) {
		cmd := exec.Command(d.den, "ssh", "box")
		cmd.Env = append(os.Environ(), "DEN_SOCKET="+d.socket, "TERM=xterm")
		checkPTYSession(t, cmd)
	})

	t.Run("ls and info", func(t *testing.T) {
		var vms []vmJSON
		if err := json.Unmarshal([]byte(d.must("ls", "--json")), &vms); err != nil {
			t.Fatal(err)
		}
		if len(vms) != 1 || vms[0].Name != "box" || vms[0].State != "running" {
			t.Fatalf("ls: %+v", vms)
		}
		if out := d.must("ls"); !strings.Contains(out, "box") || !strings.Contains(out, "running") {
			t.Fatalf("ls table: %q", out)
		}
		if out := d.must("logs", "box"); !strings.Contains(out, "==> console") {
			t.Fatalf("logs: %q", out)
		}
		var info struct{ VMM, Accel string }
		if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil || info.VMM == "" || info.Accel == "" {
			t.Fatalf("daemon info: %+v %v", info, err)
		}
	})

	t.Run("daemon killed and restarted", func(t *testing.T) {
		before := d.info("box")
		d.must("exec", "box", "--", "sh", "-c", "echo kept > /root/marker; sync")
		d.kill()
		d.start()
		after := d.info("box")
		if after.State != "running" || after.PID != before.PID {
			t.Fatalf("after restart: %+v, before: %+v", after, before)
		}
		if out := d.must("exec", "box", "--", "cat", "/root/marker"); out != "kept\n" {
			t.Fatalf("marker after restart: %q", out)
		}
	})

	t.Run("vmm killed", func(t *testing.T) {
		pid := d.info("box").PID
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var vm vmJSON
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if vm = d.info("box"); vm.State == "stopped" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if vm.State != "stopped" || !strings.Contains(vm.Reason, "vmm") {
			t.Fatalf("after the vmm was killed: %+v", vm)
		}
		// Reaching it again boots it from its disk: the file is there.
		if out := d.must("exec", "box", "--", "cat", "/root/marker"); out != "kept\n" {
			t.Fatalf("marker after a cold boot: %q", out)
		}
	})

	t.Run("rm", func(t *testing.T) {
		pid := d.info("box").PID
		d.must("rm", "box")
		if _, err := d.run("info", "box"); exitCode(err) == 0 {
			t.Fatal("info of a removed vm succeeded")
		}
		if syscall.Kill(pid, 0) == nil {
			t.Fatalf("vmm %d still runs after rm", pid)
		}
	})
}

// TestBadInput checks that bad requests get one clear line and a non-zero
// exit, and change nothing.
func TestBadInput(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "one", "--memory", "256M")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"create", "one"}, `the name is taken`},
		{[]string{"create", "Bad_Name"}, `bad vm name "Bad_Name"`},
		{[]string{"create", "trailing-"}, `bad vm name "trailing-"`},
		{[]string{"create", "big", "--memory", "100T"}, `more than this host has`},
		{[]string{"create", "big", "--cpus", "512"}, `bad cpus 512`},
		{[]string{"create", "big", "--disk", "3T"}, `too large`},
		{[]string{"create", "big", "--disk", "1900G"}, `does not fit: the volume has`},
		{[]string{"create", "big", "--memory", "lots"}, `bad size "lots"`},
		{[]string{"create", "big", "--image", "nosuch"}, `no image named "nosuch" (images: minimal, debian)`},
		{[]string{"exec", "ghost", "--", "true"}, `no vm named "ghost"`},
		{[]string{"info", "ghost"}, `no vm named "ghost"`},
		{[]string{"rm", "ghost"}, `no vm named "ghost"`},
		{[]string{"exec", "one"}, `missing command`},
	}
	for _, c := range cases {
		_, err := d.run(c.args...)
		msg := stderrOf(err)
		if exitCode(err) == 0 || !strings.Contains(msg, c.want) || strings.Count(msg, "\n") > 0 {
			t.Errorf("den %s: exit %d, stderr %q; want one line with %q", strings.Join(c.args, " "), exitCode(err), msg, c.want)
		}
	}
	// Nothing was made or lost by the failures.
	var vms []vmJSON
	if err := json.Unmarshal([]byte(d.must("ls", "--json")), &vms); err != nil {
		t.Fatal(err)
	}
	if len(vms) != 1 || vms[0].Name != "one" || vms[0].State != "running" {
		t.Fatalf("after bad input: %+v", vms)
	}
	if out := d.must("exec", "one", "--", "echo", "fine"); out != "fine\n" {
		t.Fatalf("vm after bad input: %q", out)
	}
}

// waitCmd waits for cmd, killing it after timeout.
func waitCmd(cmd *exec.Cmd, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		return <-done
	}
}
