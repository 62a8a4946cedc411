package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/agent"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		in, want string // words split on spaces; want "" for an error
		err      string // a part of the error
	}{
		// Flags after the name move before it; arguments go after "--".
		{in: "create box", want: "create -- box"},
		{in: "create box --memory 2G", want: "create --memory 2G -- box"},
		{in: "create box --memory=2G --cold", want: "create --memory=2G --cold -- box"},
		{in: "create --cpus 2 box -memory 1G", want: "create --cpus 2 -memory 1G -- box"},
		{in: "create box --cold=false", want: "create --cold=false -- box"},
		{in: "ls", want: "ls"},
		{in: "ls --json", want: "ls --json"},
		{in: "rm -f a b", want: "rm -f -- a b"},
		{in: "rm a --force b", want: "rm --force -- a b"},
		{in: "checkpoint box -m deps --keep 3", want: "checkpoint -m deps --keep 3 -- box"},
		{in: "checkpoint box -m --keep", want: "checkpoint -m --keep -- box"}, // a value may look like a flag
		{in: "checkpoint box --comment=x --disk-only", want: "checkpoint --comment=x --disk-only -- box"},
		{in: "restore box cp-3 --no-save", want: "restore --no-save -- box cp-3"},
		{in: "fork box@cp-1 box2 --json", want: "fork --json -- box@cp-1 box2"},
		{in: "keys add - --user alice", want: "keys add --user alice -- -"},
		{in: "info", want: "info"},
		{in: "info --gateway", want: "info --gateway"},
		// No verb after "--": urfave/cli would run it with the words after
		// it as its flags (a gateway user's --socket).
		{in: "keys -- ls --socket /other.sock", err: `den keys: a verb cannot come after "--"`},
		{in: "checkpoint -- verify box --socket /s", err: `den checkpoint: a verb cannot come after "--"`},
		{in: "net -- log box", err: `den net: a verb cannot come after "--"`},
		// Subverbs take the flags, wherever they are.
		{in: "checkpoint rm box cp-1 cp-2 --socket /s", want: "checkpoint rm --socket /s -- box cp-1 cp-2"},
		{in: "checkpoint --socket /s rm box cp-1", want: "checkpoint rm --socket /s -- box cp-1"},
		{in: "keys rm laptop", want: "keys rm -- laptop"},
		{in: "keys", want: "keys"},
		{in: "keys help", want: "keys --help"},
		{in: "keys help add", want: "keys add --help"},
		{in: "keys help nope", err: `den keys: unknown verb "nope"`},
		{in: "checkpoint help", want: "checkpoint --help"},
		{in: "checkpoint help rm", want: "checkpoint rm --help"},
		{in: "ls help", want: "ls --help"},
		{in: "exec help", want: "exec --help"},
		{in: "rm box help", want: "rm -- box help"},
		{in: "exec box help", want: "exec -- box help"},
		// After "--" every word is an argument.
		{in: "rm -- --force", want: "rm -- --force"},
		{in: "create -- box --memroy", want: "create -- box --memroy"},
		// exec: the command and every word after it are the command's.
		{in: "exec box -- uname -a", want: "exec -- box uname -a"},
		{in: "exec box ls -la", want: "exec -- box ls -la"},
		{in: "exec box --tty -- top", want: "exec --tty -- box top"},
		{in: "exec -t box top", want: "exec -t -- box top"},
		{in: "exec box -e A=1 --env B=2 -w /src make --tty", want: "exec -e A=1 --env B=2 -w /src -- box make --tty"},
		{in: "exec box ls -- -x", want: "exec -- box ls -- -x"},
		{in: "exec box -- -- x", want: "exec -- box -- x"},
		{in: "exec box -- ls --memroy", want: "exec -- box ls --memroy"},
		{in: "exec box sh -c --help", want: "exec -- box sh -c --help"},
		// Help.
		{in: "help", want: "--help"},
		{in: "help create", want: "create --help"},
		{in: "help keys add", want: "keys add --help"},
		{in: "create box --help", want: "create --help"},
		{in: "create box -h", want: "create --help"},
		{in: "exec box --help ls", want: "exec --help"},
		{in: "create box --help=false", want: "create --help=false -- box"},
		{in: "checkpoint box -m --help", want: "checkpoint -m --help -- box"},
		{in: "--help", want: "--help"},
		{in: "-v", want: "-v"},
		// Unknown flags, wherever they are.
		{in: "create box --memroy 2G", err: "den create: unknown flag --memroy (see den create --help)"},
		{in: "create --memroy 2G box", err: "den create: unknown flag --memroy"},
		{in: "create box --memroy=2G", err: "den create: unknown flag --memroy (see"},
		{in: "create box -x", err: "den create: unknown flag -x"},
		{in: "create box ---memory 2G", err: "unknown flag ---memory"},
		{in: "create box --tty", err: "den create: unknown flag --tty"},
		{in: "ls --jsno", err: "den ls: unknown flag --jsno"},
		{in: "rm box -force", want: "rm -force -- box"}, // Go flags take one dash or two
		{in: "rm box -forse", err: "den rm: unknown flag -forse"},
		{in: "exec box --memory 1G -- ls", err: "den exec: unknown flag --memory"},
		{in: "exec box -it -- ls", err: "den exec: unknown flag -it"},
		{in: "ssh box -t", err: "den ssh: unknown flag -t"},
		{in: "checkpoint rm box cp-1 -m x", err: "den checkpoint rm: unknown flag -m (see den checkpoint rm --help)"},
		{in: "checkpoint -m x rm box cp-1", err: "den checkpoint rm: unknown flag -m"},
		{in: "keys add --force k.pub", err: "den keys add: unknown flag --force"},
		{in: "daemon --state /x", err: "den daemon: unknown flag --state"},
		{in: "--socket /s ls", err: "den: unknown flag --socket (see den --help)"},
		// Other mistakes.
		{in: "create box --memory", err: "den create: flag --memory needs a value"},
		{in: "create box --image -- --socket=/x", err: "den create: flag --image needs a value"},
		{in: "checkpoint box -m=--", want: "checkpoint -m=-- -- box"},
		{in: "ls --json=maybe", err: "den ls: --json=maybe: use --json alone"},
		{in: "crate box", err: `den: unknown verb "crate" (see den --help)`},
		{in: "help crate", err: `den: unknown verb "crate"`},
		{in: "keys list", err: `den keys: unknown verb "list" (see den keys --help)`},
	} {
		got, err := parseArgs(newApp(&Env{}), append([]string{"den"}, strings.Fields(tc.in)...))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("den %s: got %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		want := append([]string{"den"}, strings.Fields(tc.want)...)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("den %s: got %q, %v; want %q", tc.in, got, err, want)
		}
	}
}

// TestParseArgsEveryFlag: every flag of every verb is known after the
// verb's arguments, in each of its forms.
func TestParseArgsEveryFlag(t *testing.T) {
	var walk func(path []string, cmds []*cli.Command)
	walk = func(path []string, cmds []*cli.Command) {
		for _, c := range cmds {
			p := append(slices.Clone(path), c.Name)
			walk(p, c.Subcommands)
			if c.Action == nil {
				continue
			}
			for _, f := range c.Flags {
				_, isBool := f.(*cli.BoolFlag)
				for _, n := range f.Names() {
					dash := "--"
					if len(n) == 1 {
						dash = "-"
					}
					forms := [][]string{{dash + n + "=1"}}
					if isBool {
						forms = [][]string{{dash + n}, {dash + n + "=true"}}
					} else {
						forms = append(forms, []string{dash + n, "1"})
					}
					for _, form := range forms {
						in := append(append(append([]string{"den"}, p...), "arg"), form...)
						got, err := parseArgs(newApp(&Env{}), in)
						want := append(append(append([]string{"den"}, p...), form...), "--", "arg")
						if err != nil || !slices.Equal(got, want) {
							t.Errorf("%q: got %q, %v; want %q", in, got, err, want)
						}
					}
				}
			}
		}
	}
	walk(nil, newApp(&Env{}).Commands)
}

// TestUsageErrors runs den up to the point where it would call the
// daemon: mistakes are one line on stderr and exit status 2, before any
// connection (the socket does not exist).
func TestUsageErrors(t *testing.T) {
	big := strings.Repeat("x", 500_000)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "a", "b"}, `den create: too many arguments ("a" "b"): it takes one VM name (see den create --help)`},
		{[]string{"create"}, "den create: missing VM name (see den create --help)"},
		{[]string{"create", "box", "--memory", "NaN"}, `den create: --memory: bad size "NaN": use a whole number of MiB with K, M, G or T, e.g. 512M or 4G (see den create --help)`},
		{[]string{"create", "box", "--memory", "-1G"}, `den create: --memory: bad size "-1G": must be more than zero`},
		{[]string{"create", "box", "--disk", "NaN"}, `den create: --disk: bad size "NaN"`},
		{[]string{"create", "box", "--disk", "0.5"}, `den create: --disk: bad size "0.5"`},
		{[]string{"create", "box", "--disk", "Inf"}, `den create: --disk: bad size "Inf"`},
		{[]string{"create", "box", "--disk", "1000K"}, `den create: --disk: bad size "1000K": use a whole number of MiB`},
		{[]string{"create", "box", "--cpus", "0"}, "den create: --cpus 0: give 1 or more"},
		{[]string{"create", "box", "--cpus", "two"}, `den create: invalid value "two" for flag -cpus`},
		{[]string{"ls", "box"}, `den ls: too many arguments ("box"): it takes none (see den ls --help)`},
		{[]string{"info", "a", "b"}, `den info: too many arguments ("a" "b")`},
		{[]string{"info", "box", "--gateway"}, "den info: --gateway takes no VM name"},
		{[]string{"ssh", "a", "b"}, `den ssh: too many arguments ("a" "b")`},
		{[]string{"logs", "a", "b"}, `den logs: too many arguments`},
		{[]string{"sleep", "a", "b"}, `den sleep: too many arguments`},
		{[]string{"wake", "a", "b"}, `den wake: too many arguments`},
		{[]string{"checkpoint", "a", "b"}, `den checkpoint: too many arguments`},
		{[]string{"checkpoints", "a", "b"}, `den checkpoints: too many arguments`},
		{[]string{"keys", "ls", "x"}, `den keys ls: too many arguments ("x")`},
		{[]string{"doctor", "x"}, `den doctor: too many arguments ("x")`},
		{[]string{"daemon", "x"}, `den daemon: too many arguments ("x")`},
		{[]string{"bench", "x"}, `den bench: too many arguments ("x")`},
		{[]string{"exec", "box"}, "den exec: missing command"},
		{[]string{"exec", "box", "--"}, "den exec: missing command"},
		{[]string{"exec", "box", "-e", "NOEQUALS", "--", "env"}, `den exec: bad --env "NOEQUALS": use KEY=VALUE`},
		{[]string{"exec", "box", "--", big}, "den exec: command line is 500000 bytes, at most 131071 (pass large data on stdin: den exec box -- sh -c 'cat > f' < file)"},
		{[]string{"exec", "box", "echo", strings.Repeat("'", 70_000)}, "den exec: command line is 280007 bytes"}, // quoted
		{[]string{"exec", "box", "-e", "K=" + big, "--", "env"}, "den exec: --env K=xxxxxxxxxxxxxxxxxx... is 500002 bytes, at most 131071"},
		{[]string{"create", "box", "--memroy", "2G"}, "den create: unknown flag --memroy (see den create --help)"},
	} {
		stderr, code := runDen(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("den %.80q: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestCommandLineLimit: the longest line exec takes is the longest the
// agent sends.
func TestCommandLineLimit(t *testing.T) {
	ok := strings.Repeat("x", agent.MaxCommandLine-len("echo "))
	if n := len(agent.QuoteCommand([]string{"echo", ok})); n != agent.MaxCommandLine {
		t.Fatalf("line of %d bytes", n)
	}
	// Past the check, den connects to the (missing) daemon: exit 1.
	if stderr, code := runDen(t, "exec", "box", "echo", ok); code != 1 || !strings.Contains(stderr, "daemon") {
		t.Errorf("exit %d, %q; want 1 and the daemon's absence", code, stderr)
	}
	if stderr, code := runDen(t, "exec", "box", "echo", ok+"x"); code != 2 || !strings.Contains(stderr, "at most 131071") {
		t.Errorf("exit %d, %q; want 2 and the limit", code, stderr)
	}
}

// runDen runs den's command line as main does, with the daemon's socket
// missing, and returns what it printed on stderr and its exit status.
func runDen(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	t.Setenv("DEN_SOCKET", t.TempDir()+"/none.sock")
	code := Run(context.Background(), Env{Stdout: &stdout, Stderr: &stderr}, append([]string{"den"}, args...))
	return stderr.String(), code
}
