package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/agent"
)

func execCommand() *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command in a VM; its exit status becomes den's",
		ArgsUsage: "NAME -- CMD [ARG...]",
		UsageText: "den exec NAME [--tty] [--env K=V]... [--workdir DIR] [--] CMD [ARG...]",
		Description: `stdin, stdout and stderr are streamed. A stopped or sleeping VM is started first.

den's flags go before CMD. CMD is the first word after NAME that is not
one of den's flags, or the first after --: from there on every word is the
command's, flags included (den exec box ls -la runs ls -la). Use -- when
CMD itself starts with '-'. The command line, quoted for the guest's shell,
must stay under 128 KiB: pass larger data on stdin.

Examples:
   den exec box -- uname -a
   den exec box --workdir /src --env CI=1 -- make test
   echo hi | den exec box -- tr a-z A-Z
   den exec box -- sh -c 'cat > data.bin' < data.bin
   den exec box --tty -- top`,
		Flags: withDaemon(
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "run on a pseudo-terminal"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "set KEY=VALUE in the command's environment"},
			&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory in the guest"},
		),
		Action: func(c *cli.Context) error {
			name, err := needName(c)
			if err != nil {
				return err
			}
			// parseArgs took den's "--": a "--" here is the command's.
			argv := c.Args().Tail()
			if len(argv) == 0 {
				return usageExit(c, "missing command: den exec NAME [--] CMD [ARG...]")
			}
			o := sessionOptions{
				cmd: agent.QuoteCommand(argv), tty: c.Bool("tty"), env: c.StringSlice("env"), workdir: c.String("workdir"),
			}
			if err := checkExec(c, name, o); err != nil {
				return err
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			return runSession(ctx, c, name, o)
		},
	}
}

// checkExec refuses, before the VM is woken, what the guest could not
// run: a malformed --env, and a command line, environment entry or
// working directory too long for one argument of the guest's exec (the
// SSH channel request carrying it would be refused before that).
func checkExec(c *cli.Context, name string, o sessionOptions) error {
	if n := len(o.cmd); n > agent.MaxCommandLine {
		return cli.Exit(fmt.Sprintf("%s: command line is %d bytes, at most %d (pass large data on stdin: den exec %s -- sh -c 'cat > f' < file)",
			verbPath(c), n, agent.MaxCommandLine, name), 2)
	}
	for _, kv := range o.env {
		if _, _, ok := splitEnv(kv); !ok {
			return usageExit(c, "bad --env %q: use KEY=VALUE", kv)
		}
		if n := len(kv); n > agent.MaxCommandLine {
			return cli.Exit(fmt.Sprintf("%s: --env %.20s... is %d bytes, at most %d (pass large data on stdin)", verbPath(c), kv, n, agent.MaxCommandLine), 2)
		}
	}
	if n := len(o.workdir); n > agent.MaxCommandLine {
		return cli.Exit(fmt.Sprintf("%s: --workdir is %d bytes, at most %d", verbPath(c), n, agent.MaxCommandLine), 2)
	}
	return nil
}
