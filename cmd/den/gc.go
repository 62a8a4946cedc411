package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
)

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:      "gc",
		Usage:     "collect the memory store: remove what no snapshot names (admins)",
		UsageText: "den gc [--dry-run] [--json]",
		Description: `The daemon collects in the background, soon after checkpoints, VMs or
sleeps go and every 30 minutes; den gc collects now. Packs younger than the
grace period (den daemon --gc-grace, 10m) stay: a snapshot being written
may be about to name them.

Examples:
   den gc --dry-run
   sudo den gc`,
		Flags: withDaemon(jsonFlag(), &cli.BoolFlag{Name: "dry-run", Usage: "only say what would go"}),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			got, err := cl.CollectGarbage(c.Context, api.GCRequest{DryRun: c.Bool("dry-run")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, got)
			}
			verb, moved := "removed", "moved"
			if got.DryRun {
				verb, moved = "would remove", "would move"
			}
			fmt.Fprintf(c.App.Writer, "%s %d packs none of %d snapshots names (%s); %s %s out of %d packs mostly dead, freeing %s; %d of %d packs younger than the grace period left as they are\n",
				verb, len(got.Garbage), got.Manifests, size.Format(got.Bytes), moved, size.Format(got.Moved), len(got.Repacked), size.Format(got.Freed), got.Young, got.Packs)
			return nil
		},
	}
}
