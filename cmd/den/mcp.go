package main

import (
	"io"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"

	"github.com/denhq/den/mcpserver"
)

func mcpCommand() *cli.Command {
	return &cli.Command{
		Name:      "mcp",
		Usage:     "serve your VMs to an AI agent as Model Context Protocol tools, over stdin and stdout",
		UsageText: "den mcp [--socket PATH | --url https://HOST:PORT --token T [--ca F]]\n   ssh -p 2222 den@HOST mcp",
		Description: `An MCP client (Claude Desktop, Claude Code, an agent framework) starts den mcp
and speaks JSON-RPC to it on stdin and stdout. Every tool call is a den API call
as you (the socket's user, or the token's with --url): the agent sees and
touches only your VMs, as den's CLI does.

Tools: list, info, create, exec (a shell command line; exit status, stdout and
stderr in the result, capped; killed at its timeout), read_file, write_file,
checkpoint, checkpoints, restore, fork, sleep, wake, url. Resources: each VM's
checkpoint tree, den://vms/NAME/checkpoints.

Through the SSH gateway, ssh -p 2222 den@HOST mcp is the same server, as the
key's user, for clients on another machine. The daemon also serves the tools
over streamable HTTP at /v1/mcp on its TLS API listener (den daemon
--api-listen), behind a bearer token (den tokens add). docs/mcp.md has each
set up.

Examples:
   den mcp                                   # what an MCP client runs
   claude mcp add den -- den mcp             # Claude Code
   den mcp --url https://den.example.org:8443 --token "$DEN_TOKEN"
   ssh -p 2222 den@den.example.org mcp       # from another machine, with your key

   # Claude Desktop (claude_desktop_config.json) or any client's JSON:
   {"mcpServers": {"den": {"command": "den", "args": ["mcp"]}}}`,
		Flags: daemonFlags(),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageExit(c, "takes no arguments (%s)", quoteAll(c.Args().Slice()))
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			mcpserver.Version = version
			log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelWarn}))
			t := &mcp.IOTransport{Reader: io.NopCloser(c.App.Reader), Writer: nopWriteCloser{c.App.Writer}}
			return mcpserver.New(cl, log).Run(ctx, t)
		},
	}
}

// nopWriteCloser is w with a Close that does nothing: the run's stdout
// is not den mcp's to close.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
