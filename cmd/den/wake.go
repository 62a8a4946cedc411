package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

func wakeCommand() *cli.Command {
	return &cli.Command{
		Name:      "wake",
		Usage:     "wake a sleeping VM (or boot a stopped or lost one) and wait for it",
		ArgsUsage: "NAME",
		UsageText: "den wake NAME\n   den wake --all [--timeout D] [--parallel N] [--json]",
		Description: `--all wakes every sleeping VM (root only), the most recently active first,
--parallel at a time, within --timeout, printing each VM as it is done;
stopped VMs stay stopped. The exit status is 1 if any VM was not woken, and
the line names them. After a host shutdown that ran den sleep --all
--shutdown, the daemon wakes the VMs it put to sleep by itself when it
starts: den wake --all is for the others.

Examples:
   den wake box
   den wake --all --parallel 2`,
		Flags: withDaemon(jsonFlag(),
			&cli.BoolFlag{Name: "all", Usage: "every sleeping VM (root only)"},
			&cli.DurationFlag{Name: "timeout", Usage: "with --all: bound for the whole operation", DefaultText: "2m"},
			&cli.IntFlag{Name: "parallel", Usage: "with --all: VMs woken at once", DefaultText: "4"},
		),
		Action: func(c *cli.Context) error {
			if c.Bool("all") {
				if c.NArg() > 0 {
					return usageExit(c, "--all takes no VM name (%s)", quoteAll(c.Args().Slice()))
				}
				timeout, parallel, err := hostFlags(c)
				if err != nil {
					return err
				}
				ctx, cancel := withSignals(c)
				defer cancel()
				req := api.HostWakeRequest{Timeout: timeout, Parallel: parallel}
				return runHost(c, "awake", func(progress func(api.HostVM)) (api.HostSummary, error) {
					cl, err := newClient(c)
					if err != nil {
						return api.HostSummary{}, err
					}
					return cl.WakeAll(ctx, req, progress)
				})
			}
			for _, f := range []string{"timeout", "parallel"} {
				if c.IsSet(f) {
					return usageExit(c, "--%s goes with --all", f)
				}
			}
			name, err := oneName(c)
			if err != nil {
				return err
			}
			start := time.Now()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			vm, err := cl.Wake(c.Context, name)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, vm)
			}
			fmt.Fprintf(c.App.Writer, "%s is %s (%s)\n", name, vm.State, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
