package sshgw

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

func TestDenArgs(t *testing.T) {
	ok := map[string][]string{
		`ls`:                             {"ls"},
		`ls --json`:                      {"ls", "--json"},
		`create box2 --memory 256M`:      {"create", "box2", "--memory", "256M"},
		`exec box -- sh -c 'echo $HOME'`: {"exec", "box", "--", "sh", "-c", "echo $HOME"},
		`exec box -- printf "%s|" "a b"`: {"exec", "box", "--", "printf", "%s|", "a b"},
		`--help`:                         {"--help"},
		`keys add -`:                     {"keys", "add", "-"},
	}
	for in, want := range ok {
		got, err := DenArgs(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("DenArgs(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := map[string]string{
		``:                 "usage: ssh",
		`ls 'unterminated`: "cannot split",
	}
	for in, want := range bad {
		if _, err := DenArgs(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DenArgs(%q): %v; want an error with %q", in, err, want)
		}
	}
}

func TestDenCommand(t *testing.T) {
	runner := func(ctx context.Context, user, source string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
		in, _ := io.ReadAll(stdin)
		fmt.Fprintf(stdout, "user=%s local=%v args=%s\n", user, strings.HasPrefix(source, "127.0.0.1:"), strings.Join(args, " "))
		stderr.Write(in)
		return 4
	}
	f := newFixture(t, func(c *Config) { c.Den = &DenCommand{Run: runner} })
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
	if want := "user=bob local=true args=ls --json two words\n"; out.String() != want {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
	if errb.String() != "from stdin" {
		t.Fatalf("stderr %q", errb.String())
	}
	// A command line that does not split: one line, exit 2, den not run.
	_, errs, code := run(t, c, "ls 'open")
	if code != 2 || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, `den: cannot split the command`) {
		t.Fatalf("bad command line: %d %q", code, errs)
	}
	// den@ relays no forwards.
	if _, err := c.Dial("tcp", "127.0.0.1:80"); err == nil {
		t.Fatal("den@ forwarded a port")
	}
	if n := f.b.opens.Load(); n != 0 {
		t.Fatalf("den@ claimed %d vms", n)
	}
}
