package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/internal/validate"
)

func createCommand() *cli.Command {
	return &cli.Command{
		Name:      "create",
		Usage:     "create a VM and boot it",
		ArgsUsage: "NAME",
		UsageText: "den create NAME [--cpus N] [--memory SIZE] [--disk SIZE] [--image NAME] [--idle-timeout D] [--egress POLICY] [--cold]",
		Description: `NAME is a DNS label (a-z, 0-9, '-'). Sizes are whole MiB, with K, M, G or T
(powers of 1024): 512M, 1.5G, 20G.
The disk is a clone of the image's base disk on the storage volume. The VM is
restored from the image's warm base snapshot (booted once per image and size,
then reused) with a new identity, so create costs a restore, not a boot;
--cold boots it instead. --egress limits where it may connect (see den net).

Examples:
   den create box
   den create big --cpus 2 --memory 2G --disk 20G --image debian
   den create agent --egress allow:github.com,pypi.org,files.pythonhosted.org`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.IntFlag{Name: "cpus", Usage: "vCPUs", Value: api.DefaultCPUs},
			&cli.StringFlag{Name: "memory", Usage: "guest RAM", Value: size.Format(api.DefaultMemory)},
			&cli.StringFlag{Name: "disk", Usage: "disk size (sparse; default " + size.Format(api.DefaultDisk) + ", or the image's disk when larger)"},
			&cli.StringFlag{Name: "image", Usage: "root filesystem: debian or minimal (default: the daemon's)"},
			&cli.BoolFlag{Name: "cold", Usage: "boot instead of restoring the image's warm base snapshot"},
			&cli.StringFlag{Name: "egress", Usage: "egress policy: allow-all, deny-all, allow:LIST of CIDRs and domains, or deny:LIST of CIDRs[;allow:LIST] (default: the daemon's)"},
			&cli.StringFlag{Name: "idle-timeout", Usage: "sleep after this long idle; 0 never", Value: api.DefaultIdleTimeout.String()},
			&cli.StringFlag{Name: "on-host-loss", Usage: "in a cluster, when the host that runs it is lost: wait (for den wake or den restore) or restart (boot it from its disk on another host)", Value: "wait"},
		),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			if img := c.String("image"); img != "" {
				if err := checkArgs(c, validate.Image, img); err != nil {
					return err
				}
			}
			if n := c.Int("cpus"); n < 1 {
				return usageExit(c, "--cpus %d: give 1 or more", n)
			}
			mem, err := size.ParseMiB(c.String("memory"))
			if err != nil {
				return usageExit(c, "--memory: %w", err)
			}
			var disk int64 // 0: the daemon's default
			if c.IsSet("disk") {
				if disk, err = size.ParseMiB(c.String("disk")); err != nil {
					return usageExit(c, "--disk: %w", err)
				}
			}
			if p := c.String("egress"); c.IsSet("egress") {
				if _, err := egress.Parse(p); err != nil {
					return usageExit(c, "--egress: %w", err)
				}
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			start := time.Now()
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			vm, err := cl.CreateVM(ctx, api.CreateRequest{
				Name: name, Image: c.String("image"), CPUs: c.Int("cpus"), MemoryBytes: mem, DiskBytes: disk,
				IdleTimeout: c.String("idle-timeout"), Cold: c.Bool("cold"), Egress: c.String("egress"), OnHostLoss: c.String("on-host-loss"),
			}, func(ev api.Event) {
				if !c.Bool("json") {
					fmt.Fprintf(c.App.ErrWriter, "  %-8s %s\n", ev.Elapsed, ev.Progress)
				}
			})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, vm)
			}
			fmt.Fprintf(c.App.Writer, "created %s (%s, %s) in %s\n", vm.Name, vm.VMM, vm.Accel, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
