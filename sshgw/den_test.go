package sshgw

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

func TestDenArgs(t *testing.T) {
	d := &DenCommand{}
	ok := map[string][]string{
		`ls`:                             {"ls"},
		`ls --json`:                      {"ls", "--json"},
		`create box2 --memory 256M`:      {"create", "box2", "--memory", "256M"},
		`exec box -- sh -c 'echo $HOME'`: {"exec", "box", "--", "sh", "-c", "echo $HOME"},
		`exec box -- printf "%s|" "a b"`: {"exec", "box", "--", "printf", "%s|", "a b"},
		`exec box -- grep --socket x`:    {"exec", "box", "--", "grep", "--socket", "x"},
		`--help`:                         {"--help"},
		`keys add -`:                     {"keys", "add", "-"},
	}
	for in, want := range ok {
		got, err := d.DenArgs(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("DenArgs(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := map[string]string{
		``:                        "usage: ssh",
		`daemon`:                  `"daemon" cannot be run`,
		`doctor`:                  `"doctor" cannot be run`,
		`ssh box`:                 `"ssh" cannot be run`,
		`--socket /x ls`:          `"--socket" cannot be run`,
		`ls --socket /tmp/x.sock`: "--socket cannot be given",
		`ls -socket=/tmp/x.sock`:  "--socket cannot be given",
		`ls 'unterminated`:        "cannot split",
		`--help ls`:               "usage: ssh",
	}
	for in, want := range bad {
		if _, err := d.DenArgs(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DenArgs(%q): %v; want an error with %q", in, err, want)
		}
	}
}

func TestDenCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "den")
	script := "#!/bin/sh\necho \"owner=$DEN_OWNER socket=$DEN_SOCKET remote=$DEN_REMOTE args=$*\"\ncat >&2\nexit 4\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Den = &DenCommand{Binary: bin, Socket: "/run/den/test.sock"} })
	c, err := f.dial(DenUser, f.bob)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	s.Stdout, s.Stderr, s.Stdin = &out, &errb, strings.NewReader("from stdin")
	err = s.Run(`ls --json "two words"`)
	if ee, ok := err.(*gossh.ExitError); !ok || ee.ExitStatus() != 4 {
		t.Fatalf("exit: %v", err)
	}
	if want := "owner=bob socket=/run/den/test.sock remote=1 args=ls --json two words\n"; out.String() != want {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
	if errb.String() != "from stdin" {
		t.Fatalf("stderr %q", errb.String())
	}
	// A refused verb: one line, exit 2, den not run.
	_, errs, code := run(t, c, "daemon")
	if code != 2 || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, `den: "daemon" cannot be run through the gateway`) {
		t.Fatalf("daemon verb: %d %q", code, errs)
	}
	// den@ relays no forwards.
	if _, err := c.Dial("tcp", "127.0.0.1:80"); err == nil {
		t.Fatal("den@ forwarded a port")
	}
	if n := f.b.opens.Load(); n != 0 {
		t.Fatalf("den@ claimed %d vms", n)
	}
}
