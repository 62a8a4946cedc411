package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/internal/validate"
)

func netCommand() *cli.Command {
	return &cli.Command{
		Name:      "net",
		Usage:     "a VM's network: its egress policy, and what the policy refused",
		UsageText: "den net policy NAME POLICY\n   den net log NAME",
		Description: `Every VM has a TAP device and an address of its own, NAT out through the
host, and an egress policy: allow-all, deny-all, allow:LIST where LIST
mixes CIDRs (10.0.0.0/8, 1.2.3.4) and domain names (github.com,
*.example.org), or deny:LIST of CIDRs, everything else allowed (with
;allow:LIST after it, what may be reached even so: quote it for the
shell). Names are enforced by the VM's resolver in the daemon: under an
allow list it answers only the listed names and lets their answers
through the firewall, and traffic to any other address is dropped; under
a deny list it answers every name, and the names of its allow list open
their answers even inside the denied CIDRs.

Examples:
   den net policy box allow:github.com,*.githubusercontent.com,10.0.0.0/8
   den net policy box deny-all
   den net policy box 'deny:169.254.169.254,10.0.0.0/8;allow:10.1.2.3'
   den net log box`,
		Subcommands: []*cli.Command{netPolicyCommand(), netLogCommand()},
	}
}

func netPolicyCommand() *cli.Command {
	return &cli.Command{
		Name:      "policy",
		Usage:     "change a VM's egress policy, at once (running VMs too)",
		ArgsUsage: "NAME POLICY",
		UsageText: "den net policy NAME allow-all|deny-all|allow:LIST|deny:LIST[;allow:LIST]",
		Description: `Open connections are cut and meet the new policy when they go on.

Examples:
   den net policy box allow:pypi.org,files.pythonhosted.org
   den net policy box allow-all`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return usageExit(c, "want a VM name and a policy")
			}
			name, policy := c.Args().Get(0), c.Args().Get(1)
			if err := checkArgs(c, validate.VMName, name); err != nil {
				return err
			}
			if _, err := egress.Parse(policy); err != nil {
				return usageExit(c, "%w", err)
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			n, err := cl.SetEgress(c.Context, name, api.EgressRequest{Policy: policy})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, n)
			}
			fmt.Fprintf(c.App.Writer, "%s: egress %s\n", name, n.Egress)
			return nil
		},
	}
}

func netLogCommand() *cli.Command {
	return &cli.Command{
		Name:      "log",
		Usage:     "show a VM's address and policy, and what was dropped of its traffic",
		ArgsUsage: "NAME",
		UsageText: "den net log NAME [--json]",
		Description: `Lists the destinations of the VM's packets that were dropped (address,
protocol, port, packets; each kept an hour after its last packet): refused
by the egress policy, addressed to another VM, or to the host beyond the
VM's resolver and ping; and the names the VM's resolver refused: why a pip
install hangs.

Examples:
   den net log box
   den net log box --json`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			n, err := cl.Net(c.Context, name)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, n)
			}
			fmt.Fprintf(c.App.Writer, "network:  %s", n.Mode)
			if n.IP != "" {
				fmt.Fprintf(c.App.Writer, ", %s", n.IP)
			}
			if n.Tap != "" {
				fmt.Fprintf(c.App.Writer, " (tap %s)", n.Tap)
			}
			fmt.Fprintf(c.App.Writer, "\negress:   %s\n", n.Egress)
			if n.Mode != "tap" {
				return nil
			}
			fmt.Fprintf(c.App.Writer, "denied:   %d packets\n", n.DeniedPackets)
			for _, d := range n.Denied {
				dst := d.Addr
				if d.Port != 0 {
					dst = fmt.Sprintf("%s:%d", d.Addr, d.Port)
				}
				fmt.Fprintf(c.App.Writer, "  %-22s %-5s %d packets\n", dst, d.Proto, d.Packets)
			}
			fmt.Fprintf(c.App.Writer, "dns:      %d queries, %d refused\n", n.DNSQueries, n.DNSRefused)
			if len(n.RefusedNames) > 0 {
				fmt.Fprintf(c.App.Writer, "  refused: %s\n", strings.Join(n.RefusedNames, ", "))
			}
			return nil
		},
	}
}
