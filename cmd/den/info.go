package main

import (
	"fmt"

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
		Flags: []cli.Flag{socketFlag, jsonFlag,
			&cli.BoolFlag{Name: "gateway", Usage: "print the SSH gateway's address and host key fingerprint"}},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usageExit(c, "too many arguments (%s): it takes one VM name, or none", quoteAll(c.Args().Slice()))
			}
			cl := newClient(c)
			if c.NArg() == 0 {
				info, err := cl.Info(c.Context)
				if err != nil {
					return err
				}
				if c.Bool("gateway") {
					return printGateway(info, c.Bool("json"))
				}
				if c.Bool("json") {
					return printJSON(info)
				}
				fmt.Printf("version:  %s\nvmm:      %s\naccel:    %s (%s)\nstate:    %s\nvolume:   %s\nnetwork:  %s\n",
					info.Version, info.VMM, info.Accel, info.AccelNote, info.StateDir, info.Volume, info.Network)
				if info.Memory != nil {
					fmt.Printf("memory:   %s\n", memoryLine(info.Memory))
				}
				if info.GuestRAM != "" {
					fmt.Printf("guest RAM: %s\n", info.GuestRAM)
				}
				return printGateway(info, false)
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
				return printJSON(vm)
			}
			fmt.Printf("name:         %s\nstate:        %s\n", vm.Name, vm.State)
			if vm.Reason != "" {
				fmt.Printf("reason:       %s\n", vm.Reason)
			}
			if vm.Operation != "" {
				fmt.Printf("operation:    %s (since %s)\n", vm.Operation, vm.OperationFor)
			}
			fmt.Printf("owner:        %s\nimage:        %s\ncpus:         %d\nmemory:       %s\ndisk:         %s used of %s\nvmm:          %s (%s)\n",
				vm.Owner, vm.Image, vm.CPUs, size.Format(vm.MemoryBytes), size.Format(vm.DiskUsed),
				size.Format(vm.DiskBytes), vm.VMM, vm.Accel)
			if vm.PID != 0 {
				fmt.Printf("pid:          %d\n", vm.PID)
			}
			if vm.Network != "" {
				fmt.Printf("network:      %s", vm.Network)
				if vm.IP != "" {
					fmt.Printf(", %s", vm.IP)
				}
				fmt.Println()
			}
			if vm.Egress != "" {
				fmt.Printf("egress:       %s\n", vm.Egress)
			}
			if info, err := cl.Info(c.Context); err == nil && info.HTTP != "" {
				if u, err := cl.URL(c.Context, vm.Name); err == nil {
					fmt.Printf("url:          %s (port %d%s)\n", u.URL, u.Port, map[bool]string{true: ", public", false: ""}[u.Public])
				}
			}
			fmt.Printf("idle timeout: %s\ncreated:      %s\nlast active:  %s\n", vm.IdleTimeout,
				vm.CreatedAt.Local().Format("2006-01-02 15:04:05"), ago(vm.LastActive))
			return nil
		},
	}
}

// printGateway prints the SSH gateway's address and host key.
func printGateway(info api.DaemonInfo, asJSON bool) error {
	if asJSON {
		return printJSON(struct {
			Gateway     string `json:"gateway"`
			Fingerprint string `json:"fingerprint"`
		}{info.Gateway, info.GatewayFingerprint})
	}
	if info.Gateway == "" {
		fmt.Println("gateway:  off (den daemon --ssh-listen ADDR)")
		return nil
	}
	fmt.Printf("gateway:  %s\nhost key: %s\n", info.Gateway, info.GatewayFingerprint)
	return nil
}
