package main

import (
	"github.com/urfave/cli/v2"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "print a VM's VMM log and guest console",
		ArgsUsage: "NAME",
		UsageText: "den logs NAME",
		Description: `Examples:
   den logs box | less`,
		Flags: withDaemon(),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			return cl.Logs(c.Context, name, c.App.Writer)
		},
	}
}
