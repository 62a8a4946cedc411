package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/internal/validate"
)

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:      "info",
		Usage:     "show a VM, or the daemon when no name is given",
		ArgsUsage: "[NAME]",
		UsageText: "den info [NAME] [--json] | den info --gateway",
		Description: `Examples:
   den info box
   den info            # the daemon: VMM, accelerator, volume, network, gateway
   den info box --json
   den info --gateway  # the SSH gateway's address and host key fingerprint`,
		Flags: withDaemon(jsonFlag(),
			&cli.BoolFlag{Name: "gateway", Usage: "print the SSH gateway's address and host key fingerprint"}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usageExit(c, "too many arguments (%s): it takes one VM name, or none", quoteAll(c.Args().Slice()))
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			if c.NArg() == 0 {
				info, err := cl.Info(c.Context)
				if err != nil {
					return err
				}
				if c.Bool("gateway") {
					return printGateway(c.App.Writer, info, c.Bool("json"))
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, info)
				}
				fmt.Fprintf(c.App.Writer, "version:  %s\nvmm:      %s\naccel:    %s (%s)\nstate:    %s\nvolume:   %s\nnetwork:  %s\n",
					info.Version, info.VMM, info.Accel, info.AccelNote, info.StateDir, info.Volume, info.Network)
				if info.Memory != nil {
					fmt.Fprintf(c.App.Writer, "memory:   %s\n", memoryLine(info.Memory))
				}
				if info.GuestRAM != "" {
					fmt.Fprintf(c.App.Writer, "guest RAM: %s\n", info.GuestRAM)
				}
				if cf := info.Confinement; cf != nil {
					if cf.User != "" {
						fmt.Fprintf(c.App.Writer, "vmms:     as %s, cgroup v%d, guarded from host addresses: %v\n", cf.User, cf.CgroupVersion, cf.Guarded)
					} else {
						fmt.Fprintf(c.App.Writer, "vmms:     as root (%s)\n", cf.Missing)
					}
				}
				if info.API != "" {
					fmt.Fprintf(c.App.Writer, "api:      https://%s (certificate sha256 %s)\n", info.API, info.APIFingerprint)
				}
				if info.E2B != "" {
					fmt.Fprintf(c.App.Writer, "e2b:      %s (E2B_API_URL and E2B_SANDBOX_URL; docs/e2b.md)\n", info.E2B)
				}
				return printGateway(c.App.Writer, info, false)
			}
			if c.Bool("gateway") {
				return usageExit(c, "--gateway takes no VM name")
			}
			if err := checkArgs(c, validate.VMName, c.Args().First()); err != nil {
				return err
			}
			vm, err := cl.GetVM(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, vm)
			}
			state := vm.State
			if vm.Host != "" {
				state += " on host " + vm.Host
			}
			fmt.Fprintf(c.App.Writer, "name:         %s\nstate:        %s\n", vm.Name, state)
			if vm.Reason != "" {
				fmt.Fprintf(c.App.Writer, "reason:       %s\n", vm.Reason)
			}
			if vm.Operation != "" {
				fmt.Fprintf(c.App.Writer, "operation:    %s (since %s)\n", vm.Operation, vm.OperationFor)
			}
			fmt.Fprintf(c.App.Writer, "owner:        %s\nimage:        %s\ncpus:         %d\nmemory:       %s\ndisk:         %s used of %s\nvmm:          %s (%s)\n",
				vm.Owner, vm.Image, vm.CPUs, size.Format(vm.MemoryBytes), size.Format(vm.DiskUsed),
				size.Format(vm.DiskBytes), vm.VMM, vm.Accel)
			if vm.PID != 0 {
				fmt.Fprintf(c.App.Writer, "pid:          %d\n", vm.PID)
			}
			if g := vm.Cgroup; g != nil {
				fmt.Fprintf(c.App.Writer, "cgroup:       v%d %s: memory %s of %s, cpu %.1fs (quota %g cores), pids %d of %d\n",
					g.Version, g.Name, size.Format(g.MemoryCurrent), size.Format(g.MemoryMax), g.CPUSeconds, g.CPUQuota, g.PidsCurrent, g.PidsMax)
			}
			if vm.Network != "" {
				fmt.Fprintf(c.App.Writer, "network:      %s", vm.Network)
				if vm.IP != "" {
					fmt.Fprintf(c.App.Writer, ", %s", vm.IP)
				}
				fmt.Fprintln(c.App.Writer)
			}
			if vm.Egress != "" {
				fmt.Fprintf(c.App.Writer, "egress:       %s\n", vm.Egress)
			}
			if info, err := cl.Info(c.Context); err == nil && info.HTTP != "" {
				if u, err := cl.URL(c.Context, vm.Name); err == nil {
					fmt.Fprintf(c.App.Writer, "url:          %s (port %d%s)\n", u.URL, u.Port, map[bool]string{true: ", public", false: ""}[u.Public])
				}
			}
			fmt.Fprintf(c.App.Writer, "idle timeout: %s\ncreated:      %s\nlast active:  %s\n", vm.IdleTimeout,
				vm.CreatedAt.Local().Format("2006-01-02 15:04:05"), ago(vm.LastActive))
			return nil
		},
	}
}

// printGateway prints the SSH gateway's address and host key.
func printGateway(w io.Writer, info api.DaemonInfo, asJSON bool) error {
	if asJSON {
		return printJSON(w, struct {
			Gateway     string `json:"gateway"`
			Fingerprint string `json:"fingerprint"`
		}{info.Gateway, info.GatewayFingerprint})
	}
	if info.Gateway == "" {
		fmt.Fprintln(w, "gateway:  off (den daemon --ssh-listen ADDR)")
		return nil
	}
	fmt.Fprintf(w, "gateway:  %s\nhost key: %s\n", info.Gateway, info.GatewayFingerprint)
	return nil
}
