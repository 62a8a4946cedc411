package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func auditCommand() *cli.Command {
	return &cli.Command{
		Name:      "audit",
		Usage:     "show the audit log: API calls, den@ commands and gateway sessions",
		UsageText: "den audit [--vm NAME] [--user USER] [--since DURATION|TIME] [--limit N] [--json]",
		Description: `One record per API call, den@ command and gateway session: when, who, from
where, what, on which VM, the result and how long it took. Admins see every
user's records; anyone else their own.

Examples:
   den audit --since 1h
   den audit --vm box --limit 20
   den audit --user alice --json | jq -r 'select(.result != "ok")'`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.StringFlag{Name: "vm", Usage: "only this VM's records"},
			&cli.StringFlag{Name: "user", Usage: "only this user's records (an admin's filter)"},
			&cli.StringFlag{Name: "since", Usage: "only records from this long ago (1h, 30m) or this RFC 3339 time on"},
			&cli.IntFlag{Name: "limit", Value: 100, Usage: "the last N records (0: all)"},
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			q := api.AuditQuery{VM: c.String("vm"), User: c.String("user"), Limit: c.Int("limit")}
			if q.VM != "" {
				if err := checkArgs(c, validate.VMName, q.VM); err != nil {
					return err
				}
			}
			if q.User != "" {
				if err := checkArgs(c, validate.User, q.User); err != nil {
					return err
				}
			}
			if q.Limit < 0 {
				return usageExit(c, "--limit %d: use 0 or more", q.Limit)
			}
			var err error
			if q.Since, err = sinceFlag(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			recs, err := cl.Audit(c.Context, q)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, recs)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tUSER\tSOURCE\tVERB\tVM\tRESULT\tMS")
			for _, r := range recs {
				user := r.User
				if user == "" {
					user = "-"
				}
				if r.Admin {
					user += "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\n", r.Time.Local().Format("2006-01-02 15:04:05"), user,
					strings.ReplaceAll(r.Source, "\t", " "), r.Verb, orDash(r.VM), r.Result, r.DurationMS)
			}
			return tw.Flush()
		},
	}
}

// sinceFlag reads --since: a duration back from now (1h, 10m) or an RFC
// 3339 time; zero when not given.
func sinceFlag(c *cli.Context) (time.Time, error) {
	s := c.String("since")
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, usageExit(c, "--since %q: use a duration (1h, 10m) or an RFC 3339 time", s)
}
