package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/internal/validate"
)

// commandAfter holds the verbs whose arguments end with a command of
// their own: after that many arguments (exec: NAME), the next word starts
// the command, and it and every word after it are the command's, even
// those that look like den's flags (den exec box ls -la).
var commandAfter = map[string]int{"den exec": 1}

// parseArgs checks a command line (os.Args) against app's verbs and
// their flags, and returns it in the order urfave/cli parses: verb (and
// subverb), flags, "--", positional arguments. urfave/cli stops at the
// first positional argument, so this is what lets flags follow the VM
// name (den exec box --tty -- top), and what refuses a flag den does not
// know wherever it comes, instead of taking it for an argument. Words
// after "--" are positional; "-" is positional (stdin). The error, one
// line for the user, is a usage error (exit status 2).
//
// `den help [VERB...]` and `den VERB help [SUBVERB]` are `den [VERB...]
// --help`.
func parseArgs(app *cli.App, args []string) ([]string, error) {
	return parseArgsCheck(app, args, nil)
}

// flagCheck, if not nil, is asked about each flag a command line gives
// (name without dashes or value) before it is looked up among cmd's: an
// error refuses the command line.
type flagCheck func(cmd *cli.Command, name string) error

// parseArgsCheck is parseArgs, with check asked about every flag.
func parseArgsCheck(app *cli.App, args []string, check flagCheck) ([]string, error) {
	if len(args) < 2 {
		return args, nil
	}
	verb := args[1]
	if verb == "help" {
		if len(args) == 2 {
			return []string{args[0], "--help"}, nil
		}
		return parseArgsCheck(app, append(append([]string{args[0]}, args[2:]...), "--help"), check)
	}
	if isFlag(verb) {
		name, _, _ := strings.Cut(strings.TrimLeft(verb, "-"), "=")
		if verb == "--" || isHelpOrVersion(name) {
			return args, nil // urfave/cli's own
		}
		return nil, fmt.Errorf("den: unknown flag %s (see den --help)", verb)
	}
	cmd := findCommand(app.Commands, verb)
	if cmd == nil {
		return nil, fmt.Errorf("den: unknown verb %q (see den --help)", verb)
	}
	out := []string{args[0], verb}
	path := "den " + cmd.Name
	rest := args[2:]
	for {
		l, err := scanLevel(cmd, path, rest, check)
		if err != nil {
			return nil, err
		}
		if l.sub != nil {
			// The words before the subverb are flags, the subverb's: a
			// parent's flag would be shadowed by the subverb's default.
			out = append(out, rest[l.at])
			rest = append(rest[:l.at:l.at], rest[l.at+1:]...)
			cmd, path = l.sub, path+" "+l.sub.Name
			continue
		}
		if l.help {
			// urfave/cli would take the arguments for help topics.
			return append(out, "--help"), nil
		}
		out = append(out, l.flags...)
		if len(l.pos) > 0 {
			out = append(append(out, "--"), l.pos...)
		}
		return out, nil
	}
}

// level is one verb's part of a command line.
type level struct {
	sub   *cli.Command // if set, the subverb that rest[at] names; the other words are its
	at    int
	flags []string // the verb's flags, each with its value
	pos   []string // positional arguments
	help  bool     // --help is among the flags
}

// scanLevel splits the arguments of cmd (named path) into its flags and
// its positional arguments, or finds the subverb they are for; check (if
// not nil) is asked about each flag.
func scanLevel(cmd *cli.Command, path string, rest []string, check flagCheck) (level, error) {
	var l level
	kinds := flagKinds(cmd)
	isHelp := func(name string) bool { return slices.Contains(cli.HelpFlag.Names(), name) }
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			// A verb never follows "--": urfave/cli would still run it
			// as a subverb, parsing the words after it as flags (the SSH
			// gateway's checks stop at "--").
			if i+1 < len(rest) && len(cmd.Subcommands) > 0 && (cmd.Action == nil || findCommand(cmd.Subcommands, rest[i+1]) != nil) {
				return l, fmt.Errorf(`%s: a verb cannot come after "--" (see %s --help)`, path, path)
			}
			l.pos = append(l.pos, rest[i+1:]...)
			break
		}
		if !isFlag(a) {
			if a == "help" && len(l.pos) == 0 {
				// den VERB help [SUBVERB] is den VERB [SUBVERB] --help.
				if i+1 < len(rest) && len(cmd.Subcommands) > 0 {
					if sub := findCommand(cmd.Subcommands, rest[i+1]); sub != nil {
						return level{sub: sub, at: i + 1}, nil
					}
				}
				l.help = true
				continue
			}
			if len(l.pos) == 0 && len(cmd.Subcommands) > 0 {
				if sub := findCommand(cmd.Subcommands, a); sub != nil {
					return level{sub: sub, at: i}, nil
				}
				if cmd.Action == nil {
					return l, fmt.Errorf("%s: unknown verb %q (see %s --help)", path, a, path)
				}
			}
			if n, ok := commandAfter[path]; ok && len(l.pos) >= n {
				l.pos = append(l.pos, rest[i:]...)
				break
			}
			l.pos = append(l.pos, a)
			continue
		}
		flag, value, hasValue := strings.Cut(a, "=")
		name := strings.TrimPrefix(strings.TrimPrefix(flag, "-"), "-")
		if check != nil {
			if err := check(cmd, name); err != nil {
				return l, err
			}
		}
		isBool, known := kinds[name]
		if !known {
			return l, fmt.Errorf("%s: unknown flag %s (see %s --help)", path, flag, path)
		}
		l.flags = append(l.flags, a)
		switch {
		case isBool && hasValue:
			on, err := strconv.ParseBool(value)
			if err != nil {
				return l, fmt.Errorf("%s: %s: use %s alone, or %s=true or %s=false", path, a, flag, flag, flag)
			}
			l.help = l.help || on && isHelp(name)
		case isBool:
			l.help = l.help || isHelp(name)
		case !hasValue:
			// "--" is never a value: it ends the flags, as the SSH
			// gateway, which refuses some flags before it, sees it too.
			if i+1 == len(rest) || rest[i+1] == "--" {
				return l, fmt.Errorf("%s: flag %s needs a value (see %s --help)", path, flag, path)
			}
			i++
			l.flags = append(l.flags, rest[i])
		}
	}
	return l, nil
}

// isFlag says whether a word looks like a flag: "-x", "--xy", "--".
func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' }

func isHelpOrVersion(name string) bool {
	for _, f := range []cli.Flag{cli.HelpFlag, cli.VersionFlag} {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// flagKinds maps the names and aliases of cmd's flags, --help included,
// to whether they are booleans (take no separate value).
func flagKinds(cmd *cli.Command) map[string]bool {
	kinds := map[string]bool{}
	for _, n := range cli.HelpFlag.Names() {
		kinds[n] = true
	}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			kinds[n] = isBool
		}
	}
	return kinds
}

// needName returns the first argument, the VM name, or a usage error;
// for verbs that take more after it (rm, exec).
func needName(c *cli.Context) (string, error) {
	if c.NArg() < 1 {
		return "", usageExit(c, "missing VM name")
	}
	return c.Args().First(), checkArgs(c, validate.VMName, c.Args().First())
}

// checkArgs refuses, before anything is sent to the daemon, a value
// that check (internal/validate: the daemon's and the registry's own
// rules) refuses: a usage error (exit status 2).
func checkArgs(c *cli.Context, check func(string) error, vals ...string) error {
	for _, v := range vals {
		if err := check(v); err != nil {
			return usageExit(c, "%w", err)
		}
	}
	return nil
}

// oneName returns the only argument, the VM name, or a usage error.
func oneName(c *cli.Context) (string, error) {
	name, err := needName(c)
	if err == nil && c.NArg() > 1 {
		err = usageExit(c, "too many arguments (%s): it takes one VM name", quoteAll(c.Args().Slice()))
	}
	return name, err
}

// noArgs refuses arguments to a verb that takes none.
func noArgs(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageExit(c, "too many arguments (%s): it takes none", quoteAll(c.Args().Slice()))
	}
	return nil
}

// usageExit is a mistake in the command line: "den VERB: what (see den
// VERB --help)", exit status 2. format may wrap an error with %w.
func usageExit(c *cli.Context, format string, a ...any) error {
	v := verbPath(c)
	return cli.Exit(fmt.Errorf("%s: "+format+" (see %s --help)", append(append([]any{v}, a...), v)...), 2)
}

// verbPath is "den create", "den keys rm".
func verbPath(c *cli.Context) string {
	if c.Command != nil && c.Command.HelpName != "" {
		return c.Command.HelpName
	}
	if c.Command != nil && c.Command.Name != "" {
		return "den " + c.Command.Name
	}
	return "den"
}

// onUsageError makes urfave/cli's own usage errors (a flag's bad value)
// one line, like den's: "den create: invalid value ... (see den create
// --help)", exit status 2.
func onUsageError(c *cli.Context, err error, _ bool) error {
	return usageExit(c, "%w", err)
}

// setUsageErrors sets onUsageError on cmds and their subverbs, and
// leaves out urfave/cli's help subverb, one package-level command that
// every run would write to (parseArgs makes `den VERB help` `den VERB
// --help`).
func setUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = onUsageError
		c.HideHelpCommand = true
		setUsageErrors(c.Subcommands)
	}
}

func quoteAll(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return strings.Join(q, " ")
}
