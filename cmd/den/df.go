package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/internal/size"
)

func dfCommand() *cli.Command {
	return &cli.Command{
		Name:      "df",
		Usage:     "show what VMs' memory snapshots and disks take on the volume",
		UsageText: "den df [--checkpoints] [--json]",
		Description: `Memory snapshots (checkpoints, sleeps, warm bases) are stored by content:
an extent several snapshots hold is stored once. Per VM: MEMORY is the data
its snapshots name, and of it what only they name (what deleting the VM
frees); DISK the same of its disk and its checkpoints' disks (clones share
what neither changed). With --checkpoints, what deleting each checkpoint
frees. Garbage is what no snapshot names any more; the daemon collects it
in the background (den gc).

Examples:
   den df
   den df --checkpoints        # and what deleting each checkpoint frees
   den df --json | jq '.vms[] | {name, unique_bytes}'`,
		Flags: withDaemon(jsonFlag(), &cli.BoolFlag{Name: "checkpoints", Usage: "list each checkpoint too"}),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			st, err := cl.Storage(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, st)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VM\tMEMORY\tITS OWN\tDISK\tITS OWN")
			for _, vm := range st.VMs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", vm.Name, size.Format(vm.Referenced), size.Format(vm.Unique),
					size.Format(vm.Disk.Referenced), size.Format(vm.Disk.Unique))
				if c.Bool("checkpoints") {
					for _, cp := range vm.Checkpoints {
						fmt.Fprintf(tw, "  %s\t%s\t%s\t\t%s\n", cp.ID, size.Format(cp.Referenced), size.Format(cp.Frees), size.Format(cp.DiskFrees))
					}
				}
			}
			fmt.Fprintf(tw, "(warm bases)\t%s\t%s\t\t\n", size.Format(st.Bases.Referenced), size.Format(st.Bases.Unique))
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "memory store: %s in %d packs, %s named by snapshots, %s garbage; disks: %s of data\n",
				size.Format(st.Stored), st.Packs, size.Format(st.Live), size.Format(st.Garbage), size.Format(st.Disk))
			return nil
		},
	}
}
