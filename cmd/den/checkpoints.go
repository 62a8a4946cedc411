package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
)

func checkpointsCommand() *cli.Command {
	return &cli.Command{
		Name:      "checkpoints",
		Usage:     "list a VM's checkpoints as a lineage tree",
		ArgsUsage: "NAME",
		UsageText: "den checkpoints NAME [--frees] [--json]",
		Description: `The * marks the checkpoint the VM's current state descends from. MEMORY and
DISK are the data each holds; with --frees, FREES is what deleting it would
free (the memory and disk data no other snapshot or disk holds), which takes
a look at every snapshot on the volume.

Examples:
   den checkpoints box
   den checkpoints box --frees
   den checkpoints box --json | jq -r '.[].id'`,
		Flags: withDaemon(jsonFlag(), &cli.BoolFlag{Name: "frees", Usage: "show what deleting each checkpoint would free"}),
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
			frees := map[string]api.CheckpointStorage{}
			if c.Bool("frees") {
				st, err := cl.Storage(c.Context)
				if err != nil {
					return err
				}
				for _, vm := range st.VMs {
					if vm.Name == name {
						for _, cp := range vm.Checkpoints {
							frees[cp.ID] = cp
						}
					}
				}
			}
			if c.Bool("json") {
				if c.Bool("frees") {
					type withFrees struct {
						api.Checkpoint
						FreesBytes int64 `json:"frees_bytes"`
					}
					out := make([]withFrees, len(cps))
					for i, cp := range cps {
						out[i] = withFrees{cp, frees[cp.ID].Frees + frees[cp.ID].DiskFrees}
					}
					return printJSON(c.App.Writer, out)
				}
				return printJSON(c.App.Writer, cps)
			}
			if len(cps) == 0 {
				fmt.Fprintf(c.App.Writer, "%s has no checkpoints (den checkpoint %s)\n", name, name)
				return nil
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			freesCol := func(string) string { return "" }
			if c.Bool("frees") {
				fmt.Fprintln(tw, "ID\tPARENT\tCREATED\tKIND\tMEMORY\tDISK\tFREES\tCOMMENT")
				freesCol = func(id string) string { return size.Format(frees[id].Frees+frees[id].DiskFrees) + "\t" }
			} else {
				fmt.Fprintln(tw, "ID\tPARENT\tCREATED\tKIND\tMEMORY\tDISK\tCOMMENT")
			}
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
				fmt.Fprintf(tw, "%s%s%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", mark, cp.Tree, cp.ID, parent, ago(cp.CreatedAt), cp.Kind,
					size.Format(cp.MemoryBytes), size.Format(cp.DiskBytes), freesCol(cp.ID), comment)
			}
			return tw.Flush()
		},
	}
}
