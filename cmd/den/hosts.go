package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/internal/size"
)

func hostsCommand() *cli.Command {
	return &cli.Command{
		Name:      "hosts",
		Usage:     "list the hosts that share den's registry, and whether each is alive",
		UsageText: "den hosts [--json]",
		Description: `Every daemon records itself in den's registry every third of the lease:
its version, VMM, CPU, memory budget and VMs. A single host lists itself; the
hosts of a cluster (den daemon --cluster) share one PostgreSQL registry and
list each other. A host whose last heartbeat, by the registry database's
clock, is older than the lease is not alive. The host that answered is
marked with *.

Examples:
   den hosts
   den hosts --json | jq '.hosts[] | select(.alive | not) | .name'`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			l, err := cl.Hosts(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, l)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "HOST\tSTATE\tHEARTBEAT\tRUNNING\tSLEEPING\tMEMORY FREE\tCPUS\tVMM\tVERSION\tADDRESS\tCPU")
			for _, h := range l.Hosts {
				name := h.Name
				if h.This {
					name += " *"
				}
				state := "alive"
				switch {
				case !h.Alive:
					state = "down"
				case h.Draining:
					state = "draining"
				}
				free := "no budget"
				if h.MemoryBudgetBytes >= 0 {
					free = size.Format(h.MemoryFreeBytes) + " of " + size.Format(h.MemoryBudgetBytes)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s ago\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", name, state,
					(time.Duration(h.HeartbeatAgeMS) * time.Millisecond).Round(100*time.Millisecond), h.Running, h.Sleeping,
					free, h.CPUs, h.VMM, h.Version, orDash(h.Address), h.CPUModel)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "registry: %s; lease %s\n", l.Registry, time.Duration(l.LeaseMS)*time.Millisecond)
			return nil
		},
	}
}
