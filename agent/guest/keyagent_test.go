//go:build linux

package guest

import (
	"bufio"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
)

// TestKeyAgent: a connection to the guest's SSH agent socket made before
// den announced itself waits for it, and is carried to den over a
// channel both ways; a session's environment names the socket; after
// the announcing connection closes, a newer one carries.
func TestKeyAgent(t *testing.T) {
	h := newHarness(t)
	sock := filepath.Join(t.TempDir(), "ssh-agent.sock")
	if err := h.srv.ServeKeyAgent(sock); err != nil {
		t.Fatal(err)
	}
	echo := func(rw io.ReadWriter) {
		line, _ := bufio.NewReader(rw).ReadString('\n')
		io.WriteString(rw, "den: "+line)
	}
	ask := func() (string, error) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(c, "hello\n")
		return bufio.NewReader(c).ReadString('\n')
	}
	got := make(chan string, 1)
	go func() {
		s, err := ask()
		if err != nil {
			s = err.Error()
		}
		got <- s
	}()
	c := h.dial()
	if err := c.ServeKeyAgent(testCtx(t), echo); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "den: hello\n" {
		t.Fatalf("carried before the announce: %q", s)
	}
	_, out, _ := run(t, c, agent.ExecRequest{CmdLine: "echo $SSH_AUTH_SOCK"})
	if strings.TrimSpace(out) != sock {
		t.Errorf("SSH_AUTH_SOCK in a session: %q, want %s", out, sock)
	}
	c.Close()
	c2 := h.dial()
	defer c2.Close()
	if err := c2.ServeKeyAgent(testCtx(t), echo); err != nil {
		t.Fatal(err)
	}
	if s, err := ask(); err != nil || s != "den: hello\n" {
		t.Fatalf("carried over the newer connection: %q %v", s, err)
	}
}
