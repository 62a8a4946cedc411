package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
)

func lsCommand() *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list VMs",
		UsageText: "den ls [--json]",
		Description: `DISK is what the disk holds, of its size. A listing waits a couple of
seconds at most for the disks it measures: past that, a VM shows its last
figure ("-" when it has none yet; disk_used_pending in --json) and the
next listing finds the new one.

Examples:
   den ls
   den ls --json | jq -r '.[] | select(.state == "running") | .name'`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			vms, err := cl.ListVMs(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, vms)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tCPUS\tMEMORY\tDISK\tIMAGE\tVMM\tLAST ACTIVE")
			for _, vm := range vms {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s/%s\t%s\t%s\t%s\n", vm.Name, vm.State, vm.CPUs,
					size.Format(vm.MemoryBytes), diskUsed(vm), size.Format(vm.DiskBytes),
					vm.Image, vm.VMM+"/"+vm.Accel, ago(vm.LastActive))
			}
			return tw.Flush()
		},
	}
}

// diskUsed prints what a VM's disk holds: "-" while it is measured for
// the first time.
func diskUsed(vm api.VM) string {
	if vm.DiskUsedPending && vm.DiskUsed == 0 {
		return "-"
	}
	return size.Format(vm.DiskUsed)
}

// ago prints a past time as "3m ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < 5*time.Second:
		return "now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}
