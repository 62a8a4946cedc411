package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func keysCommand() *cli.Command {
	return &cli.Command{
		Name:  "keys",
		Usage: "manage the SSH public keys that log users in to the SSH gateway",
		Description: `Each key belongs to one user; through the gateway (ssh -p 2222 VM@host) a key
reaches its user's VMs only. VMs created without an owner, and keys added
without --user, belong to the user "default".

Examples:
   den keys add ~/.ssh/id_ed25519.pub
   den keys add --user alice --name laptop alice.pub
   cat id.pub | den keys add -
   den keys ls
   den keys rm SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s
   den keys rm laptop
   ssh -p 2222 box@host          # a shell in box
   ssh -p 2222 den@host ls       # den verbs, as the key's user`,
		Subcommands: []*cli.Command{keysAddCommand(), keysLsCommand(), keysRmCommand()},
	}
}

func keysAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "register a public key (a .pub file, or - for stdin)",
		ArgsUsage: "FILE|-",
		UsageText: "den keys add [--user USER] [--name NAME] FILE|-",
		Description: `FILE holds one public key in authorized_keys form (ssh-ed25519 AAAA... comment),
such as ~/.ssh/id_ed25519.pub.

Examples:
   den keys add ~/.ssh/id_ed25519.pub
   den keys add --user alice --name laptop alice.pub
   ssh -p 2222 den@host keys add - < new.pub    # a user adds another key of theirs`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.StringFlag{Name: "user", Usage: `the user the key logs in as: an admin's choice (default "default"); others add only their own`},
			&cli.StringFlag{Name: "name", Usage: "a label for the key (default: its comment)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den keys add: give one FILE (or - for stdin): den keys add [--user USER] FILE", 2)
			}
			if c.String("user") != "" {
				if err := checkArgs(c, validate.User, c.String("user")); err != nil {
					return err
				}
			}
			if err := checkArgs(c, validate.KeyName, c.String("name")); err != nil {
				return err
			}
			data, err := readKeyFile(c, c.Args().First())
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			k, err := cl.AddKey(c.Context, api.AddKeyRequest{User: c.String("user"), Name: c.String("name"), PublicKey: string(data)})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, k)
			}
			fmt.Fprintf(c.App.Writer, "added %s %s for user %s\n", k.Fingerprint, orDash(k.Name), k.User)
			return nil
		},
	}
}

// readKeyFile reads a public key from a file or the run's stdin ("-"),
// refusing to send a private key anywhere. Through the gateway only
// stdin is read: the files are the host's.
func readKeyFile(c *cli.Context, path string) ([]byte, error) {
	var data []byte
	var err error
	switch {
	case path == "-":
		data, err = io.ReadAll(io.LimitReader(c.App.Reader, 64<<10))
	case envOf(c).Remote:
		return nil, cli.Exit("den keys add: through the gateway the key comes on stdin: ssh den@HOST keys add - < key.pub", 2)
	default:
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	if bytes.Contains(data, []byte("PRIVATE KEY-----")) {
		hint := ""
		if path != "-" {
			hint = " (" + path + ".pub ?)"
		}
		return nil, fmt.Errorf("%s is a private key: give the public one%s", path, hint)
	}
	return data, nil
}

func keysLsCommand() *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list the registered keys",
		UsageText: "den keys ls [--json]",
		Description: `Examples:
   den keys ls
   den keys ls --json | jq -r '.[] | select(.user == "alice") | .fingerprint'`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			keys, err := cl.ListKeys(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, keys)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "USER\tFINGERPRINT\tTYPE\tNAME\tADDED")
			for _, k := range keys {
				typ, _, _ := bytes.Cut([]byte(k.PublicKey), []byte(" "))
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.User, k.Fingerprint, typ, orDash(k.Name), ago(k.CreatedAt))
			}
			return tw.Flush()
		},
	}
}

func keysRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "unregister a key, by fingerprint or name",
		ArgsUsage: "FINGERPRINT|NAME",
		UsageText: "den keys rm FINGERPRINT|NAME",
		Description: `A name that several keys share is refused: give the fingerprint (den keys ls).
Connections the key opened stay open; new ones are refused.

Examples:
   den keys rm SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s
   den keys rm laptop`,
		Flags: withDaemon(),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den keys rm: give one FINGERPRINT or NAME (see den keys ls)", 2)
			}
			if err := checkArgs(c, validate.KeyRef, c.Args().First()); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			k, err := cl.RemoveKey(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "removed %s %s of user %s\n", k.Fingerprint, orDash(k.Name), k.User)
			return nil
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
