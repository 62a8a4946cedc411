package main

import (
	"github.com/urfave/cli/v2"
)

func sshCommand() *cli.Command {
	return &cli.Command{
		Name:      "ssh",
		Usage:     "open an interactive shell in a VM",
		ArgsUsage: "NAME",
		UsageText: "den ssh NAME",
		Description: `A real PTY that follows your terminal's size. A stopped or sleeping VM is started first.
Without a terminal on stdin, the shell reads commands from stdin.

Examples:
   den ssh box`,
		Flags: withDaemon(),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			// No signal context: Ctrl-C belongs to the remote shell.
			return runSession(c.Context, c, name, sessionOptions{tty: isTerminal(c)})
		},
	}
}
