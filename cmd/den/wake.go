package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

func wakeCommand() *cli.Command {
	return &cli.Command{
		Name:      "wake",
		Usage:     "wake a sleeping VM (or boot a stopped one) and wait for it",
		ArgsUsage: "NAME",
		UsageText: "den wake NAME",
		Description: `Examples:
   den wake box`,
		Flags: []cli.Flag{socketFlag, jsonFlag},
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			start := time.Now()
			vm, err := newClient(c).Wake(c.Context, name)
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
