package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/internal/validate"
)

func rmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "delete a VM, its disk and its checkpoints",
		ArgsUsage: "NAME...",
		UsageText: "den rm NAME... [--force]",
		Description: `A running VM is asked to power off first; --force kills it at once.

Examples:
   den rm box
   den rm --force box other`,
		Flags: withDaemon(&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "do not wait for the guest to power off"}),
		Action: func(c *cli.Context) error {
			if _, err := needName(c); err != nil {
				return err
			}
			if err := checkArgs(c, validate.VMName, c.Args().Slice()...); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			for _, name := range c.Args().Slice() {
				if err := cl.RemoveVM(c.Context, name, c.Bool("force")); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed %s\n", name)
			}
			return nil
		},
	}
}
