package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func tokensCommand() *cli.Command {
	return &cli.Command{
		Name:  "tokens",
		Usage: "manage the bearer tokens that reach the API over TLS (den daemon --api-listen)",
		Description: `A token acts as its user, on the daemon's TLS listener only. Its secret is
shown once, when it is made; the daemon keeps only its hash. Users make and
revoke their own tokens; admins (root, --admin-group) anyone's, and admin
tokens.

Examples:
   den tokens add laptop
   DEN_URL=https://host:7443 DEN_TOKEN=den_... DEN_CA=api.crt den ls
   den tokens add --user alice ci      # an admin, for alice
   den tokens ls
   den tokens rm laptop`,
		Subcommands: []*cli.Command{tokensAddCommand(), tokensLsCommand(), tokensRmCommand()},
	}
}

func tokensAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "make a token and print its secret (once)",
		ArgsUsage: "NAME",
		UsageText: "den tokens add [--user USER] [--admin] [--json] NAME",
		Description: `Examples:
   den tokens add laptop
   den tokens add --json ci | jq -r .secret > ci.token`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.StringFlag{Name: "user", Usage: "the user the token acts as (an admin's choice; default: you)"},
			&cli.BoolFlag{Name: "admin", Usage: "the token administers den (an admin's choice)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den tokens add: give one NAME (den tokens add laptop)", 2)
			}
			if err := checkArgs(c, validate.TokenName, c.Args().First()); err != nil {
				return err
			}
			if c.String("user") != "" {
				if err := checkArgs(c, validate.User, c.String("user")); err != nil {
					return err
				}
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			t, err := cl.AddToken(c.Context, api.AddTokenRequest{Name: c.Args().First(), User: c.String("user"), Admin: c.Bool("admin")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, t)
			}
			fmt.Fprintf(c.App.ErrWriter, "token %s (%s) for user %s; its secret, shown this once:\n", t.ID, t.Name, t.User)
			fmt.Fprintln(c.App.Writer, t.Secret)
			return nil
		},
	}
}

func tokensLsCommand() *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list tokens (never their secrets)",
		UsageText: "den tokens ls [--json]",
		Description: `Examples:
   den tokens ls
   den tokens ls --json | jq -r '.[].id'`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			ts, err := cl.ListTokens(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, ts)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "USER\tID\tNAME\tADMIN\tADDED\tLAST USED")
			for _, t := range ts {
				used := "never"
				if !t.LastUsed.IsZero() {
					used = ago(t.LastUsed)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", t.User, t.ID, t.Name, t.Admin, ago(t.CreatedAt), used)
			}
			return tw.Flush()
		},
	}
}

func tokensRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "revoke a token, by id or name: its open sessions (den ssh, den exec over TLS) are closed",
		ArgsUsage: "ID|NAME",
		UsageText: "den tokens rm ID|NAME",
		Description: `The token is refused from its next request on.

Examples:
   den tokens rm laptop
   den tokens rm tok_1a2b3c4d`,
		Flags: withDaemon(),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den tokens rm: give one ID or NAME (see den tokens ls)", 2)
			}
			if err := checkArgs(c, validate.TokenRef, c.Args().First()); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			t, err := cl.RemoveToken(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "revoked %s (%s) of user %s\n", t.ID, t.Name, t.User)
			return nil
		},
	}
}
