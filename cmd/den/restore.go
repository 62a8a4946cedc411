package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func restoreCommand() *cli.Command {
	return &cli.Command{
		Name:      "restore",
		Usage:     "bring a VM back to a checkpoint: memory, processes and disk",
		ArgsUsage: "NAME CHECKPOINT",
		UsageText: "den restore NAME CHECKPOINT [--no-save] [--force]",
		Description: `What the VM did after the checkpoint is gone, unless saved: by default the
current state is checkpointed first (its id is printed, and is "saved" in
--json; a stopped VM's disk alone, its memory being gone). The guest clock is
corrected. A restore refuses while exec or ssh sessions are open; --force ends them.

Examples:
   den restore box cp-3
   den restore box cp-3 --no-save`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.BoolFlag{Name: "no-save", Usage: "do not checkpoint the current state first"},
			&cli.BoolFlag{Name: "force", Usage: "end open sessions"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return cli.Exit("den restore: give a VM name and a checkpoint (den restore box cp-3)", 2)
			}
			name, id := c.Args().Get(0), c.Args().Get(1)
			if err := checkArgs(c, validate.VMName, name); err != nil {
				return err
			}
			if err := checkArgs(c, validate.CheckpointID, id); err != nil {
				return err
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			start := time.Now()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			res, err := cl.Restore(ctx, name, api.RestoreRequest{Checkpoint: id, NoSave: c.Bool("no-save"), Force: c.Bool("force")}, progressPrinter(c))
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, res)
			}
			fmt.Fprintf(c.App.Writer, "restored %s to %s in %s", name, id, time.Since(start).Round(time.Millisecond))
			if res.Saved != "" {
				fmt.Fprintf(c.App.Writer, "; the state before it is %s", res.Saved)
			}
			fmt.Fprintln(c.App.Writer)
			return nil
		},
	}
}
