package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

func checkpointScheduleCommand() *cli.Command {
	return &cli.Command{
		Name:      "schedule",
		Usage:     "checkpoint a VM on a schedule, keeping what a retention says",
		ArgsUsage: "NAME",
		UsageText: "den checkpoint schedule NAME --every 10m [--keep 24] [--keep-daily 7] [--disk-only] [--json]\n   den checkpoint schedule NAME --off\n   den checkpoint schedule NAME   # show it",
		Description: `While the VM runs, a checkpoint (comment "scheduled") is taken every
--every; a sleeping or stopped VM has not changed, and gets none. Of the
scheduled checkpoints the newest --keep stay, and the newest of each of the
last --keep-daily days; the rest are deleted, and the memory only they held
is collected. Checkpoints taken by hand are never the schedule's to delete.
Memory checkpoints of an idle VM cost the few MiB it changed (den df).

Examples:
   den checkpoint schedule box --every 10m --keep 24 --keep-daily 7
   den checkpoint schedule box --every 1h --keep 12 --disk-only
   den checkpoint schedule box --off`,
		Flags: withDaemon(jsonFlag(),
			&cli.DurationFlag{Name: "every", Usage: "interval between checkpoints (at least 1s)"},
			&cli.IntFlag{Name: "keep", Value: 24, Usage: "keep the newest N scheduled checkpoints"},
			&cli.IntFlag{Name: "keep-daily", Usage: "and the newest of each of the last N days"},
			&cli.BoolFlag{Name: "disk-only", Usage: "disk-only checkpoints (restoring one boots)"},
			&cli.BoolFlag{Name: "off", Usage: "remove the schedule (its checkpoints stay)"}),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			var info api.ScheduleInfo
			switch {
			case c.Bool("off") && c.IsSet("every"):
				return usageExit(c, "--off and --every: one or the other")
			case c.Bool("off"):
				info, err = cl.SetSchedule(c.Context, name, api.ScheduleRequest{Off: true})
			case c.IsSet("every"):
				info, err = cl.SetSchedule(c.Context, name, api.ScheduleRequest{Every: c.Duration("every").String(),
					Keep: c.Int("keep"), KeepDaily: c.Int("keep-daily"), DiskOnly: c.Bool("disk-only")})
			default:
				info, err = cl.Schedule(c.Context, name)
			}
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, info)
			}
			s := info.Schedule
			if s == nil {
				fmt.Fprintf(c.App.Writer, "%s has no checkpoint schedule\n", name)
				return nil
			}
			kind := "memory+disk"
			if s.DiskOnly {
				kind = "disk-only"
			}
			fmt.Fprintf(c.App.Writer, "%s: a %s checkpoint every %s while it runs; keeps the newest %d", name, kind, s.Every, s.Keep)
			if s.KeepDaily > 0 {
				fmt.Fprintf(c.App.Writer, " and the newest of each of the last %d days", s.KeepDaily)
			}
			fmt.Fprintln(c.App.Writer)
			if len(s.Taken) > 0 {
				fmt.Fprintf(c.App.Writer, "kept: %s (last %s ago)\n", strings.Join(s.Taken, " "), time.Since(s.Last).Round(time.Second))
			}
			return nil
		},
	}
}
