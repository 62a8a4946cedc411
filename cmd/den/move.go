package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

func moveCommand() *cli.Command {
	return &cli.Command{
		Name:      "move",
		Usage:     "move a VM to another host of the cluster: sleep here, wake there",
		ArgsUsage: "NAME",
		UsageText: "den move NAME --to HOST [--force] [--json]",
		Description: `The VM is put to sleep on the host that runs it and woken on HOST from the
shared volume: its memory, processes, disk, URL and SSH access come along.
It prints what each step took. A VM that runs nowhere (asleep, stopped) is
only woken on HOST. Any host of the cluster takes the request: it goes to
the host that runs the VM. Open sessions make it refuse unless --force
(they end). den hosts lists the hosts.

Examples:
   den move box --to host-b
   den move box --to host-b --json | jq .wake_ms`,
		Flags: withDaemon(jsonFlag(),
			&cli.StringFlag{Name: "to", Usage: "the host to wake it on", Required: true},
			&cli.BoolFlag{Name: "force", Usage: "move it with sessions open (they end)"},
		),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			res, err := cl.Move(ctx, name, api.MoveRequest{To: c.String("to"), Force: c.Bool("force")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, res)
			}
			ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
			if res.From != "" {
				fmt.Fprintf(c.App.Writer, "slept on %s   %s\n", res.From, ms(res.SleepMS))
			}
			fmt.Fprintf(c.App.Writer, "woke on %s    %s\n%s is %s on %s (%s)\n", res.To, ms(res.WakeMS), name, res.VM.State, res.To, ms(res.TotalMS))
			return nil
		},
	}
}
