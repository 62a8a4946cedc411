package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

func sleepCommand() *cli.Command {
	return &cli.Command{
		Name:      "sleep",
		Usage:     "save a VM's memory and stop its VMM: no RAM, no CPU held",
		ArgsUsage: "NAME",
		UsageText: "den sleep NAME [--force]",
		Description: `A sleeping VM wakes when anything reaches it (exec, ssh, the gateway, den wake).
VMs also sleep by themselves after their idle timeout. Open sessions make
sleep refuse unless --force.

Examples:
   den sleep box`,
		Flags: []cli.Flag{socketFlag, jsonFlag, &cli.BoolFlag{Name: "force", Usage: "sleep even with sessions open"}},
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			start := time.Now()
			vm, err := newClient(c).Sleep(c.Context, name, api.SleepRequest{Force: c.Bool("force")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(vm)
			}
			fmt.Printf("%s is %s (%s)\n", name, vm.State, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
