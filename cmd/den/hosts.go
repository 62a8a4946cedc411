package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
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
   den hosts --json | jq '.hosts[] | select(.alive | not) | .name'
   den hosts drain host-b`,
		Flags:       withDaemon(jsonFlag()),
		Subcommands: []*cli.Command{hostsDrainCommand()},
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

func hostsDrainCommand() *cli.Command {
	return &cli.Command{
		Name:      "drain",
		Usage:     "move a cluster host's running VMs to other hosts, and admit no new ones there",
		ArgsUsage: "HOST",
		UsageText: "den hosts drain HOST [--force] [--json]\n   den hosts drain HOST --undo",
		Description: `The host is marked draining: it admits no new VMs (creates, and wakes of VMs
that run nowhere, go to another host). Each VM it runs is moved (den move) to
the live host with the most free memory budget, printing what each took;
the exit status is 1 if any VM could not be moved, and the line names them.
Open sessions make a move refuse unless --force (they end). --undo admits
VMs on the host again. Root (or an admin) only; any host of the cluster
takes the request.

Examples:
   den hosts drain host-b
   den hosts drain host-b --undo`,
		Flags: withDaemon(jsonFlag(),
			&cli.BoolFlag{Name: "undo", Usage: "admit VMs on the host again"},
			&cli.BoolFlag{Name: "force", Usage: "move VMs with sessions open (they end)"},
		),
		Action: func(c *cli.Context) error {
			host, err := oneName(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			res, err := cl.Drain(ctx, host, api.DrainRequest{Undo: c.Bool("undo"), Force: c.Bool("force")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if err := printJSON(c.App.Writer, res); err != nil {
					return err
				}
			} else {
				for _, m := range res.Moved {
					fmt.Fprintf(c.App.Writer, "%s: moved to %s (sleep %s, wake %s)\n", m.VM.Name, m.To,
						time.Duration(m.SleepMS)*time.Millisecond, time.Duration(m.WakeMS)*time.Millisecond)
				}
				for _, f := range res.Failed {
					fmt.Fprintf(c.App.Writer, "%s: not moved: %s\n", f.VM, f.Error)
				}
				state := "draining"
				if !res.Draining {
					state = "admitting vms"
				}
				fmt.Fprintf(c.App.Writer, "%s is %s\n", res.Host, state)
			}
			if len(res.Failed) > 0 {
				names := make([]string, len(res.Failed))
				for i, f := range res.Failed {
					names[i] = f.VM
				}
				return cli.Exit(fmt.Sprintf("den hosts drain: not moved: %s", strings.Join(names, ", ")), 1)
			}
			return nil
		},
	}
}
