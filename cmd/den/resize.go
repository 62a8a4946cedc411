package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
)

func resizeCommand() *cli.Command {
	return &cli.Command{
		Name:      "resize",
		Usage:     "grow a VM's disk and its root filesystem, without a reboot",
		ArgsUsage: "NAME",
		UsageText: "den resize NAME --disk SIZE",
		Description: `The disk grows to SIZE (K, M, G, T: powers of 1024; a whole number of MiB)
and the guest's root filesystem with it, while the VM runs. Disks only grow.
A sleeping or stopped VM is started first.

Examples:
   den resize box --disk 20G`,
		Flags: withDaemon(jsonFlag(),
			&cli.StringFlag{Name: "disk", Usage: "new disk size", Required: true}),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			disk, err := size.ParseMiB(c.String("disk"))
			if err != nil {
				return cli.Exit("den resize: --disk: "+err.Error(), 2)
			}
			start := time.Now()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			vm, err := cl.Resize(c.Context, name, api.ResizeRequest{DiskBytes: disk})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, vm)
			}
			fmt.Fprintf(c.App.Writer, "%s has a %s disk (%s)\n", name, size.Format(vm.DiskBytes), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
