package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/internal/validate"
)

func checkpointVerifyCommand() *cli.Command {
	return &cli.Command{
		Name:      "verify",
		Usage:     "read checkpoints whole against their digests and report each file",
		ArgsUsage: "NAME [CHECKPOINT]",
		UsageText: "den checkpoint verify NAME [CHECKPOINT] [--all] [--json]",
		Description: `Every checkpoint records digests of its files (device state, VMM config,
memory and disk, by 4 MiB extent). Restore, fork and wake check the small files
and the memory, and sample the disk; verify checks every extent: it reads the
data, and checks the holes the volume maps (no data stored: they read as zeros)
against the digest of zeros without reading them. CHECKED counts the extents
checked, READ the bytes read. A damaged
checkpoint is marked in den checkpoints and can be deleted (den checkpoint rm).
Without CHECKPOINT it verifies the head (the one marked *). The exit status is 1
when a checkpoint is damaged.

Examples:
   den checkpoint verify box cp-3
   den checkpoint verify box --all
   den checkpoint verify box --all --json | jq -r '.[] | select(.status=="damaged") | .checkpoint'`,
		Flags: withDaemon(jsonFlag(),
			&cli.BoolFlag{Name: "all", Usage: "verify every checkpoint of the VM"},
		),
		Action: func(c *cli.Context) error {
			name, err := needName(c)
			if err != nil {
				return err
			}
			req := api.VerifyRequest{All: c.Bool("all")}
			switch {
			case c.NArg() > 2:
				return usageExit(c, "too many arguments: give a VM name and at most one checkpoint")
			case c.NArg() == 2 && req.All:
				return usageExit(c, "give a checkpoint or --all, not both")
			case c.NArg() == 2:
				req.Checkpoint = c.Args().Get(1)
				if err := checkArgs(c, validate.CheckpointID, req.Checkpoint); err != nil {
					return err
				}
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			res, err := cl.VerifyCheckpoints(ctx, name, req, progressPrinter(c))
			if err != nil {
				return err
			}
			damaged := 0
			for _, v := range res {
				if v.Status == "damaged" {
					damaged++
				}
			}
			if c.Bool("json") {
				if err := printJSON(c.App.Writer, res); err != nil {
					return err
				}
			} else {
				printVerifications(c.App.Writer, res)
			}
			if damaged > 0 {
				return cli.Exit(fmt.Sprintf("den checkpoint verify: %d of %d checkpoint(s) of %s damaged", damaged, len(res), name), 1)
			}
			return nil
		},
	}
}

func printVerifications(w io.Writer, res []api.Verification) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tFILE\tSIZE\tCHECKED\tREAD\tSTATUS\tDETAIL")
	for _, v := range res {
		if len(v.Files) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%s\t%s\n", v.Checkpoint, v.Status, v.Error)
		}
		for _, f := range v.Files {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", v.Checkpoint, f.File, size.Format(f.Size), f.Extents, f.Of, size.Format(f.ReadBytes), f.Status, f.Detail)
		}
	}
	tw.Flush()
}
