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
		UsageText: "den restore NAME CHECKPOINT [--no-save] [--force]\n   den restore NAME CHECKPOINT --path PATH [--path PATH...]",
		Description: `What the VM did after the checkpoint is gone, unless saved: by default the
current state is checkpointed first (its id is printed, and is "saved" in
--json; a stopped VM's disk alone, its memory being gone). The guest clock is
corrected. A restore refuses while exec or ssh sessions are open; --force ends them.

With --path, only those paths (and what is under them) are put back, in the
running VM, through its agent; the rest of the VM, its memory and processes
included, is left alone. A disk-only checkpoint of the current state is taken
first (printed: what was put back can be had again from it); each change is
printed: restored, removed (not in the checkpoint), rewritten, relinked,
chmod, chown, skipped.

Examples:
   den restore box cp-3
   den restore box cp-3 --no-save
   den restore box cp-3 --path /root/project      # undo what changed there since cp-3`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.BoolFlag{Name: "no-save", Usage: "do not checkpoint the current state first"},
			&cli.BoolFlag{Name: "force", Usage: "end open sessions"},
			&cli.StringSliceFlag{Name: "path", Usage: "put back only this guest path and what is under it (repeatable)"},
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
			if paths := c.StringSlice("path"); len(paths) > 0 {
				if c.Bool("no-save") || c.Bool("force") {
					return cli.Exit("den restore: --path takes neither --no-save (a disk-only checkpoint is always taken first) nor --force (sessions stay open)", 2)
				}
				return restorePaths(c, name, id, paths)
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

// restorePaths puts paths of a VM back from a checkpoint and prints what
// it did.
func restorePaths(c *cli.Context, name, id string, paths []string) error {
	ctx, cancel := withSignals(c)
	defer cancel()
	start := time.Now()
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	res, err := cl.RestorePaths(ctx, name, api.RestorePathsRequest{Checkpoint: id, Paths: paths}, progressPrinter(c))
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, res)
	}
	w := c.App.Writer
	for _, a := range res.Actions {
		if a.Why != "" {
			fmt.Fprintf(w, "%-9s %s (%s)\n", a.Did, a.Path, a.Why)
		} else {
			fmt.Fprintf(w, "%-9s %s\n", a.Did, a.Path)
		}
	}
	fmt.Fprintf(w, "put back %d change(s) in %s from %s in %s; the state before it is %s\n", len(res.Actions), name, id, time.Since(start).Round(time.Millisecond), res.Saved)
	return nil
}
