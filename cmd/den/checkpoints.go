package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/internal/size"
)

func checkpointsCommand() *cli.Command {
	return &cli.Command{
		Name:      "checkpoints",
		Usage:     "list a VM's checkpoints as a lineage tree",
		ArgsUsage: "NAME",
		UsageText: "den checkpoints NAME [--json]",
		Description: `The * marks the checkpoint the VM's current state descends from.

Examples:
   den checkpoints box
   den checkpoints box --json | jq -r '.[].id'`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			cps, err := cl.Checkpoints(c.Context, name)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, cps)
			}
			if len(cps) == 0 {
				fmt.Fprintf(c.App.Writer, "%s has no checkpoints (den checkpoint %s)\n", name, name)
				return nil
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPARENT\tCREATED\tKIND\tMEMORY\tDISK\tCOMMENT")
			for _, cp := range cps {
				mark := " "
				if cp.Head {
					mark = "*"
				}
				parent := cp.Parent
				if parent == "" {
					parent = "-"
				}
				comment := cp.Comment
				if cp.Damaged != "" {
					comment = "DAMAGED (den checkpoint verify " + name + " " + cp.ID + ") " + comment
				}
				fmt.Fprintf(tw, "%s%s%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mark, cp.Tree, cp.ID, parent, ago(cp.CreatedAt), cp.Kind,
					size.Format(cp.MemoryBytes), size.Format(cp.DiskBytes), comment)
			}
			return tw.Flush()
		},
	}
}
