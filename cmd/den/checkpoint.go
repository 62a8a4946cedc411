package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func checkpointCommand() *cli.Command {
	return &cli.Command{
		Name:      "checkpoint",
		Usage:     "save a VM's memory and disk as a new checkpoint; prints its id",
		ArgsUsage: "NAME",
		UsageText: "den checkpoint NAME [-m COMMENT] [--disk-only] [--keep N]\n   den checkpoint rm NAME CHECKPOINT\n   den checkpoint verify NAME [CHECKPOINT] [--all]",
		Description: `By default memory and disk are captured at one paused instant: restoring it
brings back running processes too. --disk-only freezes the guest's filesystems
instead of pausing and captures the disk only (restoring it boots).
A sleeping VM is checkpointed from its suspend slot, a stopped one disk-only.

Examples:
   den checkpoint box -m "deps installed"
   den checkpoint box --disk-only --keep 10
   den checkpoint rm box cp-3
   den checkpoint verify box --all`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.StringFlag{Name: "m", Aliases: []string{"comment"}, Usage: "a comment"},
			&cli.BoolFlag{Name: "disk-only", Usage: "freeze filesystems and save the disk only"},
			&cli.IntFlag{Name: "keep", Usage: "afterwards keep only the newest N checkpoints"},
		),
		Subcommands: []*cli.Command{checkpointRmCommand(), checkpointVerifyCommand(), checkpointScheduleCommand()},
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			if err := checkArgs(c, validate.Comment, c.String("m")); err != nil {
				return err
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			start := time.Now()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			cp, err := cl.Checkpoint(ctx, name, api.CheckpointRequest{
				Comment: c.String("m"), DiskOnly: c.Bool("disk-only"), Keep: c.Int("keep"),
			}, progressPrinter(c))
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, cp)
			}
			fmt.Fprintf(c.App.ErrWriter, "  %s checkpoint of %s in %s\n", cp.Kind, name, time.Since(start).Round(time.Millisecond))
			fmt.Fprintln(c.App.Writer, cp.ID)
			return nil
		},
	}
}

func checkpointRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "delete a checkpoint and reclaim its space",
		ArgsUsage: "NAME CHECKPOINT...",
		UsageText: "den checkpoint rm NAME CHECKPOINT...",
		Description: `Children of a deleted checkpoint keep their place in the lineage.

Examples:
   den checkpoint rm box cp-3 cp-4`,
		Flags: withDaemon(),
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 {
				return cli.Exit("den checkpoint rm: give a VM name and checkpoint ids (den checkpoint rm NAME cp-3)", 2)
			}
			name := c.Args().First()
			if err := checkArgs(c, validate.VMName, name); err != nil {
				return err
			}
			if err := checkArgs(c, validate.CheckpointID, c.Args().Tail()...); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			for _, id := range c.Args().Tail() {
				if err := cl.DeleteCheckpoint(c.Context, name, id); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed %s of %s\n", id, name)
			}
			return nil
		},
	}
}

// progressPrinter prints progress events to stderr unless --json.
func progressPrinter(c *cli.Context) func(api.Event) {
	return func(ev api.Event) {
		if !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "  %-8s %s\n", ev.Elapsed, ev.Progress)
		}
	}
}
