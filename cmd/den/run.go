package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

// Env is one run of den's command line: its standard streams and, when the
// SSH gateway runs it for a remote user, its API client and restrictions.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Client, when set, is the connection to the daemon every verb uses;
	// --socket and $DEN_SOCKET are then not read.
	Client *api.Client
	// Remote: the gateway runs this for a remote user (Client set): only
	// RemoteVerbs run, and no verb or flag reads or writes a host file,
	// reads the environment, or names another daemon.
	Remote bool
}

// RemoteVerbs are the verbs the gateway runs: those that act on the
// daemon only through its API, where the key's user scopes what they see
// and touch. Verbs that work on the host itself (daemon, doctor, bench,
// forward) are not among them, nor ssh (use `ssh VM@host`, which has a
// terminal). Alone, --help, -h, --version and -v run too.
var RemoteVerbs = []string{
	"ls", "info", "create", "rm", "exec", "logs", "keys",
	"sleep", "wake", "resize", "checkpoint", "checkpoints", "restore", "fork", "diff", "tokens", "audit", "mcp", "help",
}

// Run runs den's command line (args[0] is the program name) and returns
// its exit status: 2 for a usage error. It writes only to env's Stdout
// and Stderr and reads only its Stdin; runs share nothing, and may run at
// once.
func Run(ctx context.Context, env Env, args []string) (status int) {
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	if env.Remote {
		// In the daemon's process: a bug in a verb ends this run only.
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintf(env.Stderr, "den: internal error: %v\n", r)
				status = 1
			}
		}()
	}
	app := newApp(&env)
	var check flagCheck
	if env.Remote {
		if env.Client == nil {
			fmt.Fprintln(env.Stderr, "den: no connection to the daemon")
			return 1
		}
		if err := checkRemoteVerb(args); err != nil {
			fmt.Fprintln(env.Stderr, err)
			return 2
		}
		check = restrictRemote(app)
	}
	argv, err := parseArgsCheck(app, args, check)
	if err != nil {
		fmt.Fprintln(env.Stderr, err)
		return 2
	}
	err = app.RunContext(ctx, argv)
	if err == nil {
		return 0
	}
	if ec, ok := err.(cli.ExitCoder); ok {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(env.Stderr, msg)
		}
		return ec.ExitCode()
	}
	fmt.Fprintln(env.Stderr, "den: "+err.Error())
	return 1
}

// RunRemote runs a den command line (args, without the program's name)
// for the SSH gateway: in the daemon's process, through client (the
// key's user's connection to the API), with Env.Remote's restrictions.
func RunRemote(ctx context.Context, client *api.Client, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return Run(ctx, Env{Stdin: stdin, Stdout: stdout, Stderr: stderr, Client: client, Remote: true}, append([]string{"den"}, args...))
}

// envOf is the Env of the run c belongs to.
func envOf(c *cli.Context) *Env {
	if env, ok := c.App.Metadata[envKey].(*Env); ok {
		return env
	}
	return &Env{}
}

const envKey = "den.env"

// fixedBoolFlag is a boolean flag that applying leaves as it is.
type fixedBoolFlag struct{ *cli.BoolFlag }

// Apply defines the flag in set, writing nothing to f (cli.BoolFlag's
// own Apply writes its default to it).
func (f *fixedBoolFlag) Apply(set *flag.FlagSet) error {
	for _, n := range f.Names() {
		set.Bool(n, f.Value, f.Usage)
	}
	return nil
}

func init() {
	// urfave/cli adds these two package-level flags to every app and verb
	// it runs, and cli.BoolFlag writes to itself when it is applied: runs
	// at once (the SSH gateway's) would share those writes.
	if f, ok := cli.HelpFlag.(*cli.BoolFlag); ok {
		cli.HelpFlag = &fixedBoolFlag{f}
	}
	if f, ok := cli.VersionFlag.(*cli.BoolFlag); ok {
		cli.VersionFlag = &fixedBoolFlag{f}
	}
}
