package main

import (
	"github.com/urfave/cli/v2"

	"github.com/denhq/den/agent"
)

func execCommand() *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command in a VM; its exit status becomes den's",
		ArgsUsage: "NAME -- CMD [ARG...]",
		UsageText: "den exec NAME [--tty] [--env K=V]... [--workdir DIR] -- CMD [ARG...]",
		Description: `stdin, stdout and stderr are streamed. A stopped or sleeping VM is started first.

Examples:
   den exec box -- uname -a
   den exec box --workdir /src --env CI=1 -- make test
   echo hi | den exec box -- tr a-z A-Z
   den exec box --tty -- top`,
		Flags: []cli.Flag{
			socketFlag,
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "run on a pseudo-terminal"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "set KEY=VALUE in the command's environment"},
			&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory in the guest"},
		},
		Action: func(c *cli.Context) error {
			name, err := needName(c)
			if err != nil {
				return err
			}
			argv := c.Args().Tail()
			if len(argv) > 0 && argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return cli.Exit("den exec: missing command (den exec NAME -- CMD...)", 2)
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			return runSession(ctx, c, name, sessionOptions{
				cmd: agent.QuoteCommand(argv), tty: c.Bool("tty"), env: c.StringSlice("env"), workdir: c.String("workdir"),
			})
		},
	}
}
