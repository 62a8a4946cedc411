package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

func sleepCommand() *cli.Command {
	return &cli.Command{
		Name:      "sleep",
		Usage:     "save a VM's memory and stop its VMM: no RAM, no CPU held",
		ArgsUsage: "NAME",
		UsageText: "den sleep NAME [--force]\n   den sleep --all [--shutdown] [--timeout D] [--parallel N] [--force] [--json]",
		Description: `A sleeping VM wakes when anything reaches it (exec, ssh, the gateway, den wake).
VMs also sleep by themselves after their idle timeout. Open sessions make
sleep refuse unless --force.

--all puts every running VM to sleep (root only), the most recently active
first, --parallel at a time, within --timeout, printing each VM as it is
done; the exit status is 1 if any VM was not put to sleep, and the line
names them.

--all --shutdown is for a host going down (packaging/den-shutdown.service
runs it at shutdown; run it from your shutdown scripts on hosts without
systemd): it also marks the VMs so that the daemon wakes them when it next
starts (a reboot costs each VM a wake, not its processes), sessions do not
hold a VM awake, a VM that cannot sleep within --timeout is stopped and
recorded with what was lost (den info shows it), and the daemon then
refuses new work until it restarts.

Examples:
   den sleep box
   den sleep --all
   den sleep --all --shutdown --timeout 2m     # at host shutdown
   den sleep --all --json | jq -r '.failed[]'`,
		Flags: withDaemon(jsonFlag(),
			&cli.BoolFlag{Name: "force", Usage: "sleep even with sessions open"},
			&cli.BoolFlag{Name: "all", Usage: "every running VM (root only)"},
			&cli.BoolFlag{Name: "shutdown", Usage: "with --all: the host is going down; wake them when den next starts"},
			&cli.DurationFlag{Name: "timeout", Usage: "with --all: bound for the whole operation", DefaultText: "2m"},
			&cli.IntFlag{Name: "parallel", Usage: "with --all: VMs put to sleep at once", DefaultText: "4"},
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
				req := api.HostSleepRequest{Shutdown: c.Bool("shutdown"), Timeout: timeout, Parallel: parallel, Force: c.Bool("force")}
				return runHost(c, "asleep", func(progress func(api.HostVM)) (api.HostSummary, error) {
					cl, err := newClient(c)
					if err != nil {
						return api.HostSummary{}, err
					}
					return cl.SleepAll(ctx, req, progress)
				})
			}
			for _, f := range []string{"shutdown", "timeout", "parallel"} {
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
			vm, err := cl.Sleep(c.Context, name, api.SleepRequest{Force: c.Bool("force")})
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

// hostFlags reads --timeout and --parallel of a verb's --all.
func hostFlags(c *cli.Context) (timeout string, parallel int, err error) {
	if c.IsSet("timeout") {
		d := c.Duration("timeout")
		if d <= 0 {
			return "", 0, usageExit(c, "--timeout %s: use a duration above 0, like 2m", d)
		}
		timeout = d.String()
	}
	if c.IsSet("parallel") {
		parallel = c.Int("parallel")
		if parallel < 1 {
			return "", 0, usageExit(c, "--parallel %d: use 1 or more", parallel)
		}
	}
	return timeout, parallel, nil
}

// runHost runs a sleep or wake of every VM, printing each VM as it is
// done (or, with --json, the summary at the end), and fails naming the
// VMs that were not done.
func runHost(c *cli.Context, done string, op func(progress func(api.HostVM)) (api.HostSummary, error)) error {
	asJSON := c.Bool("json")
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	n := 0
	sum, err := op(func(v api.HostVM) {
		if asJSON {
			return
		}
		n++
		status, detail := done, ""
		switch {
		case !v.OK:
			status, detail = "FAILED", v.Error
		case v.State != "" && v.State != strings.TrimPrefix(done, "a"):
			status = v.State
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, status, (time.Duration(v.TookMS) * time.Millisecond).String(), detail)
		_ = tw.Flush()
	})
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(c.App.Writer, sum); err != nil {
			return err
		}
	} else if len(sum.VMs) == 0 {
		fmt.Fprintln(c.App.Writer, "no vm to do")
	}
	if len(sum.Failed) > 0 {
		return fmt.Errorf("%s --all: %d of %d vms not %s: %s", c.Command.Name, len(sum.Failed), len(sum.VMs), done, strings.Join(sum.Failed, ", "))
	}
	return nil
}
