package main

import (
	"errors"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/fence"
	"github.com/denhq/den/machine"
)

func fenceCommand() *cli.Command {
	return &cli.Command{
		Name:      "fence",
		Usage:     "guard a cluster host: kill its VMMs when its daemon stops renewing its leases (started by den daemon --cluster)",
		UsageText: "den fence --state-dir DIR",
		Description: `A daemon of a cluster pushes a deadline into STATE/fence.json after every
renewal of its leases: half the lease after the renewal began. This guard,
a process apart from the daemon, kills every VMM of the state dir once the
deadline has passed, so that a frozen, hung or killed daemon never leaves
VMMs running after another host may take their VMs over. It exits when the
deadline is lifted (the daemon left the cluster with no VM running). The
daemon starts it; there is no need to run it by hand.

Examples:
   den fence --state-dir /var/lib/den`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Value: "/var/lib/den", Usage: "the daemon's state dir"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			state := machine.StateDir(c.String("state-dir"))
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			g := fence.Guard{File: state.Fence(), Lock: state.FenceLock(), Runs: state.Runs(), Log: log}
			err := g.Run(c.Context)
			if errors.Is(err, fence.ErrRunning) {
				log.Info("den fence: another guard watches this state dir")
				return nil
			}
			return err
		},
	}
}
