package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/size"
)

// activityPoll is how often --follow asks for new entries.
const activityPoll = 2 * time.Second

func activityCommand() *cli.Command {
	return &cli.Command{
		Name:      "activity",
		Usage:     "show what ran in a VM, who ran it, and what happened to the VM",
		ArgsUsage: "VM[@CHECKPOINT]",
		UsageText: "den activity VM[@CHECKPOINT] [--since DURATION|TIME] [--process] [--files] [--net] [--sessions] [--vm-events] [--session ID] [--last N] [--json] [--follow] | den activity VM --record on|off",
		Description: `The VM's activity record, oldest first: every process started in the guest
(its command line, uid and parent) and how it ended (status or signal, and
how long it ran); every file a process wrote under /root, /home, /etc and
/srv (its size then); every connection a process opened to an address outside
the guest (TCP, or a connected UDP socket: address, port, the process, and the
name den's resolver answered for that address); every den session opened on the VM (den exec, den ssh, the
SSH gateway: who, and its id, which the processes it started carry); and
what happened to the VM (boot, sleep, wake, checkpoint, restore, fork).

The guest's agent records processes from eBPF programs on the scheduler's
tracepoints, files from fanotify and connections from eBPF connect hooks; den
reads the record while the VM runs and keeps it with the VM on the volume,
bounded (den daemon --activity-cap). VM@CHECKPOINT is the record up to that
checkpoint's instant, along its own line: what a restore set aside is left
out. A sleeping VM is not woken. --record off switches the guest's record off
until its next boot (it costs nothing then), --record on back on; the switch
is in the record.

Examples:
   den activity box
   den activity box --since 10m --process
   den activity box --net
   den activity box@cp-2
   den activity box --session den-3fa2c1d0
   den activity box --follow
   den activity box --record off
   den activity box --json | jq -r 'select(.kind == "exit" and .status != 0) | .pid'`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.StringFlag{Name: "since", Usage: "only entries from this long ago (10m, 1h) or this RFC 3339 time on"},
			&cli.BoolFlag{Name: "process", Usage: "only processes started and ended"},
			&cli.BoolFlag{Name: "files", Usage: "only files written"},
			&cli.BoolFlag{Name: "net", Usage: "only connections opened"},
			&cli.BoolFlag{Name: "sessions", Usage: "only den sessions opened, and uses of den's secrets"},
			&cli.BoolFlag{Name: "vm-events", Usage: "only what happened to the VM"},
			&cli.StringFlag{Name: "session", Usage: "only this session's entries"},
			&cli.IntFlag{Name: "last", Usage: "only the newest N entries"},
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new entries until interrupted"},
			&cli.StringFlag{Name: "record", Usage: "switch the running VM's guest record on or off (until its next boot), and say so"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageExit(c, "give one VM (den activity box)")
			}
			name, id, err := parseSpec(c, c.Args().First(), false)
			if err != nil {
				return err
			}
			if sw := c.String("record"); c.IsSet("record") {
				if sw != "on" && sw != "off" || id != "" {
					return usageExit(c, "--record: give on or off, and a VM without a checkpoint (den activity box --record off)")
				}
				cl, err := newClient(c)
				if err != nil {
					return err
				}
				on, err := cl.SetActivityRecord(c.Context, name, sw == "on")
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, api.ActivityRecordRequest{On: on})
				}
				fmt.Fprintf(c.App.Writer, "%s's activity record is %s until its next boot\n", name, map[bool]string{true: "on", false: "off"}[on])
				return nil
			}
			q := api.ActivityQuery{Checkpoint: id, Session: c.String("session"), Last: c.Int("last")}
			if q.Last < 0 {
				return usageExit(c, "--last %d: use 0 or more", q.Last)
			}
			if c.Bool("process") {
				q.Kinds = append(q.Kinds, agent.ProcExec, agent.ProcExit)
			}
			if c.Bool("files") {
				q.Kinds = append(q.Kinds, agent.ProcFile)
			}
			if c.Bool("net") {
				q.Kinds = append(q.Kinds, agent.ProcConnect)
			}
			if c.Bool("sessions") {
				q.Kinds = append(q.Kinds, "session", "secret")
			}
			if c.Bool("vm-events") {
				q.Kinds = append(q.Kinds, "vm", "lost")
			}
			if q.Since, err = sinceFlag(c); err != nil {
				return err
			}
			if c.Bool("follow") && id != "" {
				return usageExit(c, "--follow: a checkpoint's record does not grow (den activity %s --follow)", name)
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			entries, err := cl.Activity(c.Context, name, q)
			if err != nil {
				return err
			}
			if !c.Bool("follow") {
				if c.Bool("json") {
					return printJSON(c.App.Writer, entries)
				}
				if len(entries) == 0 {
					fmt.Fprintf(c.App.Writer, "nothing recorded for %s yet\n", c.Args().First())
					return nil
				}
				printActivity(c.App.Writer, entries, true)
				return nil
			}
			return followActivity(c.Context, c.App.Writer, cl, name, q, entries, c.Bool("json"))
		},
	}
}

// followActivity prints entries and then new ones as they come, until
// ctx ends (an interrupt).
func followActivity(ctx context.Context, w io.Writer, cl *api.Client, name string, q api.ActivityQuery, entries []api.ActivityEntry, asJSON bool) error {
	enc := json.NewEncoder(w)
	header := true
	q.Last = 0
	for {
		for _, e := range entries {
			q.After = e.N
		}
		if asJSON {
			for _, e := range entries {
				if err := enc.Encode(e); err != nil {
					return err
				}
			}
		} else if len(entries) > 0 {
			printActivity(w, entries, header)
			header = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(activityPoll):
		}
		var err error
		if entries, err = cl.Activity(ctx, name, q); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// printActivity writes entries for people, a line each.
func printActivity(w io.Writer, entries []api.ActivityEntry, header bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "TIME\tWHAT\tPID\tSESSION\tDETAIL")
	}
	for _, e := range entries {
		pid, sess := "-", printable(e.Session)
		if e.PID > 0 {
			pid = fmt.Sprint(e.PID)
		}
		if sess == "" {
			sess = "-"
		}
		what, detail := e.Kind, printable(e.Detail)
		switch e.Kind {
		case agent.ProcExec:
			args := make([]string, len(e.Argv))
			for i, a := range e.Argv {
				args[i] = printable(a)
			}
			detail = strings.Join(args, " ")
			if e.ArgvTruncated {
				detail += " ..."
			}
			if e.UID != nil && *e.UID != 0 {
				detail = fmt.Sprintf("uid %d: %s", *e.UID, detail)
			}
		case agent.ProcExit:
			switch {
			case e.Signal != "":
				detail = "killed by " + e.Signal
			case e.Status != nil:
				detail = fmt.Sprintf("status %d", *e.Status)
			}
			detail += " after " + e.Duration.Round(time.Millisecond).String()
		case agent.ProcFile:
			what = "write"
			detail = fmt.Sprintf("%s (%s)", printable(e.Path), size.Format(e.Bytes))
			if e.Writes > 1 {
				detail += fmt.Sprintf(", %d writes", e.Writes)
			}
		case agent.ProcConnect:
			detail = e.Proto + " " + printable(e.Addr)
			if e.Name != "" {
				detail += " (" + printable(e.Name) + ")"
			}
			if e.Comm != "" {
				detail += " by " + printable(e.Comm)
			}
		case "secret":
			detail = printable(e.Secret) + ": " + detail
		case "session":
			detail = "opened by " + printable(e.Who) + " via " + printable(e.Via)
		case "vm":
			what = e.Event
			parts := []string{}
			if e.Checkpoint != "" {
				parts = append(parts, e.Checkpoint)
			}
			if e.From != "" {
				parts = append(parts, "from "+e.From)
			}
			if detail != "" {
				parts = append(parts, detail)
			}
			detail = strings.Join(parts, ": ")
		case "lost":
			if e.Lost > 0 {
				detail = fmt.Sprintf("%d events: %s", e.Lost, detail)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format("2006-01-02 15:04:05.000"), what, pid, sess, detail)
	}
	tw.Flush()
}

// printable is s as it is when it prints as it reads, else quoted: what
// a guest records (argv, paths) must not drive the terminal or forge
// lines.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
