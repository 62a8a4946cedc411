package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

func secretsCommand() *cli.Command {
	return &cli.Command{
		Name:  "secrets",
		Usage: "keep credentials VMs use without ever holding them (SSH keys for git push, HTTPS tokens)",
		Description: `den keeps each secret encrypted at rest, on the daemon's host. An ssh secret
is a private key: a VM granted it sees the key through its SSH agent socket
(SSH_AUTH_SOCK in every den exec and den ssh session), and den signs with it
only inside an SSH session bound to one of the host keys given with the
secret (OpenSSH binds sessions to their host key since 8.9), only for that
session's login. The key's bytes never enter the VM: not its memory, not its
disk, not its checkpoints. Grants count at once (revoke, or set a new value,
and the VM's next request sees it); a fork has none unless den fork
--with-secrets. Every signature asked for is in den's audit log.

An https secret is a token for named hosts: the VM holds only a placeholder
(den-secret:NAME, in an environment variable); den ends the VM's TLS to those
hosts with a CA of the VM's own that the guest trusts, puts the value in
place of the placeholder in the header or query parameter the secret names,
and sends the request on over TLS it verifies. Other hosts' traffic is not
touched. Every request that carried it is in den's audit log.

Examples:
   ssh-keyscan github.com > gh.hosts
   den secrets add deploy --known-hosts gh.hosts < ~/.ssh/id_ed25519
   den secrets grant box deploy
   den exec box -- git push        # in the VM, over SSH, signed by den
   den secrets set deploy < new_key
   den secrets revoke box deploy
   printf 'Bearer %s' "$TOKEN" | den secrets add api --host api.example.com --header Authorization
   den secrets grant box api
   den exec box -- sh -c 'curl -H "Authorization: $API" https://api.example.com/'
   den secrets ls`,
		Subcommands: []*cli.Command{secretsAddCommand(), secretsSetCommand(), secretsLsCommand(), secretsRmCommand(),
			secretsGrantCommand(), secretsRevokeCommand()},
	}
}

// secretValue reads a secret's value from --from-file or stdin.
func secretValue(c *cli.Context) (string, error) {
	var r io.Reader = os.Stdin
	if f := c.String("from-file"); f != "" {
		fh, err := os.Open(f)
		if err != nil {
			return "", cli.Exit(fmt.Sprintf("den secrets: %v", err), 1)
		}
		defer fh.Close()
		r = fh
	}
	b, err := io.ReadAll(io.LimitReader(r, 64<<10+1))
	if err != nil {
		return "", cli.Exit(fmt.Sprintf("den secrets: read the value: %v", err), 1)
	}
	if len(b) == 0 || len(b) > 64<<10 {
		return "", cli.Exit("den secrets: give the value (1 byte to 64 KiB) on stdin or with --from-file", 2)
	}
	return string(b), nil
}

func secretsAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "store an SSH private key for hosts whose keys you give, or an HTTPS token for named hosts",
		ArgsUsage: "NAME",
		UsageText: `den secrets add NAME --known-hosts FILE [--from-file KEY] [--json] < KEY
   den secrets add NAME --host HOST... (--header NAME | --query NAME) [--env VAR] [--from-file F] [--json] < VALUE`,
		Description: `The value comes from stdin or --from-file.

An ssh secret (--known-hosts) is a private key without a passphrase, for the
hosts of the known_hosts lines given (ssh-keyscan HOST). The answer shows the
key's public half, for the destination's authorized keys.

An https secret (--host) is a token for the named hosts. A VM granted it has
the placeholder den-secret:NAME in the environment variable --env (default:
NAME in upper case, '-' and '.' as '_'); when it sends that placeholder in
the --header (or --query parameter) of an HTTPS request to one of the hosts,
den puts the value in its place on the way out. Needs TAP networking.

Examples:
   den secrets add deploy --known-hosts gh.hosts < ~/.ssh/id_ed25519
   den secrets add ci --known-hosts git.hosts --from-file ci_key --json
   printf 'Bearer %s' "$TOKEN" | den secrets add openai --host api.openai.com --header Authorization
   den exec box -- sh -c 'curl -H "Authorization: $OPENAI" https://api.openai.com/v1/models'
   den secrets add maps --host maps.example.com --query key --env MAPS_KEY < key.txt`,
		Flags: withDaemon(
			jsonFlag(),
			&cli.StringFlag{Name: "known-hosts", Usage: "ssh: a file of known_hosts lines, the destinations and their host keys"},
			&cli.StringSliceFlag{Name: "host", Usage: "https: a host the secret goes to (repeat for more)"},
			&cli.StringFlag{Name: "header", Usage: "https: the request header that carries it (Authorization)"},
			&cli.StringFlag{Name: "query", Usage: "https: the query parameter that carries it"},
			&cli.StringFlag{Name: "env", Usage: "https: the VM's environment variable holding the placeholder"},
			&cli.StringFlag{Name: "from-file", Usage: "read the value from this file (default: stdin)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den secrets add: give one NAME (den secrets add deploy --known-hosts gh.hosts < key)", 2)
			}
			if err := checkArgs(c, validate.SecretName, c.Args().First()); err != nil {
				return err
			}
			req := api.AddSecretRequest{Name: c.Args().First(), Kind: "ssh"}
			switch hosts := c.StringSlice("host"); {
			case (len(hosts) > 0) == c.IsSet("known-hosts"):
				return cli.Exit("den secrets add: give --known-hosts FILE (an ssh key) or --host HOST (an https token)", 2)
			case len(hosts) > 0:
				req.Kind, req.Hosts, req.Header, req.Query, req.Env = "https", hosts, c.String("header"), c.String("query"), c.String("env")
			default:
				kh, err := os.ReadFile(c.String("known-hosts"))
				if err != nil {
					return cli.Exit(fmt.Sprintf("den secrets add: %v", err), 1)
				}
				req.KnownHosts = string(kh)
			}
			value, err := secretValue(c)
			if err != nil {
				return err
			}
			req.Value = value
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			s, err := cl.AddSecret(c.Context, req)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, s)
			}
			if s.Kind == "https" {
				where := "header " + s.Header
				if s.Query != "" {
					where = "query parameter " + s.Query
				}
				fmt.Fprintf(c.App.Writer, "secret %s for https://%s, in the %s; VMs granted it have $%s=den-secret:%s\n",
					s.Name, strings.Join(s.Hosts, ", https://"), where, s.Env, s.Name)
				return nil
			}
			fmt.Fprintf(c.App.Writer, "secret %s for %s; its public key:\n%s\n", s.Name, strings.Join(s.Hosts, ", "), s.PublicKey)
			return nil
		},
	}
}

func secretsSetCommand() *cli.Command {
	return &cli.Command{
		Name:      "set",
		Usage:     "replace a secret's value, for every VM granted it at once",
		ArgsUsage: "NAME",
		UsageText: "den secrets set NAME [--from-file KEY] [--json] < KEY",
		Description: `Examples:
   den secrets set deploy < new_key`,
		Flags: withDaemon(jsonFlag(), &cli.StringFlag{Name: "from-file", Usage: "read the value from this file (default: stdin)"}),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den secrets set: give one NAME (den secrets set deploy < key)", 2)
			}
			if err := checkArgs(c, validate.SecretName, c.Args().First()); err != nil {
				return err
			}
			value, err := secretValue(c)
			if err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			s, err := cl.SetSecret(c.Context, c.Args().First(), value)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, s)
			}
			fmt.Fprintf(c.App.Writer, "secret %s has a new value; its public key:\n%s\n", s.Name, s.PublicKey)
			return nil
		},
	}
}

func secretsLsCommand() *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list your secrets (never their values)",
		UsageText: "den secrets ls [--json]",
		Description: `Examples:
   den secrets ls
   den secrets ls --json | jq -r '.[].public_key'`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			l, err := cl.Secrets(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, l)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tHOSTS\tKEY OR PLACE\tUPDATED")
			for _, s := range l {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, strings.Join(s.Hosts, ","), secretPlace(s), s.Updated.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
}

// shortKey is an authorized_keys line cut for a table.
// secretPlace is an ssh secret's public key, cut short, or where an
// https secret goes.
func secretPlace(s api.Secret) string {
	switch {
	case s.Header != "":
		return "header " + s.Header + ", $" + s.Env
	case s.Query != "":
		return "?" + s.Query + "=, $" + s.Env
	}
	return shortKey(s.PublicKey)
}

func shortKey(k string) string {
	f := strings.Fields(k)
	if len(f) < 2 || len(f[1]) <= 16 {
		return k
	}
	return f[0] + " ..." + f[1][len(f[1])-12:]
}

func secretsRmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "delete a secret and its grants",
		ArgsUsage: "NAME",
		UsageText: "den secrets rm NAME [--json]",
		Description: `Examples:
   den secrets rm deploy`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("den secrets rm: give one NAME (den secrets rm deploy)", 2)
			}
			if err := checkArgs(c, validate.SecretName, c.Args().First()); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			s, err := cl.RemoveSecret(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, s)
			}
			fmt.Fprintf(c.App.Writer, "secret %s removed\n", s.Name)
			return nil
		},
	}
}

// grantCommand is den secrets grant or revoke.
func grantCommand(verb, usage string, do func(c *cli.Context, cl *api.Client, vm, secret string) ([]string, error)) *cli.Command {
	return &cli.Command{
		Name:      verb,
		Usage:     usage,
		ArgsUsage: "VM SECRET",
		UsageText: "den secrets " + verb + " VM SECRET [--json]",
		Description: `Examples:
   den secrets ` + verb + ` box deploy`,
		Flags: withDaemon(jsonFlag()),
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return cli.Exit(fmt.Sprintf("den secrets %s: give a VM and a secret (den secrets %s box deploy)", verb, verb), 2)
			}
			vm, secret := c.Args().Get(0), c.Args().Get(1)
			if err := checkArgs(c, validate.VMName, vm); err != nil {
				return err
			}
			if err := checkArgs(c, validate.SecretName, secret); err != nil {
				return err
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			grants, err := do(c, cl, vm, secret)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, grants)
			}
			if len(grants) == 0 {
				fmt.Fprintf(c.App.Writer, "%s has no secrets\n", vm)
				return nil
			}
			fmt.Fprintf(c.App.Writer, "%s has: %s\n", vm, strings.Join(grants, ", "))
			return nil
		},
	}
}

func secretsGrantCommand() *cli.Command {
	return grantCommand("grant", "let a VM use a secret, from its next request on", func(c *cli.Context, cl *api.Client, vm, secret string) ([]string, error) {
		return cl.GrantSecret(c.Context, vm, secret)
	})
}

func secretsRevokeCommand() *cli.Command {
	return grantCommand("revoke", "take a grant back, at once", func(c *cli.Context, cl *api.Client, vm, secret string) ([]string, error) {
		return cl.RevokeSecret(c.Context, vm, secret)
	})
}
