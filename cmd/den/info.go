package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/machine"
)

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:      "info",
		Usage:     "show a VM, or the daemon when no name is given",
		ArgsUsage: "[NAME]",
		UsageText: "den info [NAME] [--json]",
		Description: `Examples:
   den info box
   den info            # the daemon: VMM, accelerator, volume, network
   den info box --json`,
		Flags: []cli.Flag{socketFlag, jsonFlag},
		Action: func(c *cli.Context) error {
			cl := newClient(c)
			if c.NArg() == 0 {
				info, err := cl.Info(c.Context)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(info)
				}
				fmt.Printf("version:  %s\nvmm:      %s\naccel:    %s (%s)\nstate:    %s\nvolume:   %s\nnetwork:  %s\n",
					info.Version, info.VMM, info.Accel, info.AccelNote, info.StateDir, info.Volume, info.Network)
				return nil
			}
			vm, err := cl.GetVM(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(vm)
			}
			fmt.Printf("name:         %s\nstate:        %s\n", vm.Name, vm.State)
			if vm.Reason != "" {
				fmt.Printf("reason:       %s\n", vm.Reason)
			}
			fmt.Printf("owner:        %s\nimage:        %s\ncpus:         %d\nmemory:       %s\ndisk:         %s used of %s\nvmm:          %s (%s)\n",
				vm.Owner, vm.Image, vm.CPUs, machine.FormatSize(vm.MemoryBytes), machine.FormatSize(vm.DiskUsed),
				machine.FormatSize(vm.DiskBytes), vm.VMM, vm.Accel)
			if vm.PID != 0 {
				fmt.Printf("pid:          %d\n", vm.PID)
			}
			fmt.Printf("idle timeout: %s\ncreated:      %s\nlast active:  %s\n", vm.IdleTimeout,
				vm.CreatedAt.Local().Format("2006-01-02 15:04:05"), ago(vm.LastActive))
			return nil
		},
	}
}
