package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
)

func urlCommand() *cli.Command {
	return &cli.Command{
		Name:      "url",
		Usage:     "print a VM's HTTP URL (the daemon proxies it to a port of the VM, waking it)",
		ArgsUsage: "NAME",
		UsageText: "den url NAME [--port N] [--public|--private] [--rotate] [--json]",
		Description: `The daemon serves each VM's port (8080 unless --port says otherwise) on
--http-listen, at http://HOST:PORT/vm/NAME/ or, with --http-domain, at
http(s)://NAME.DOMAIN/. A sleeping VM is woken by a request, and a VM with a
request or connection open does not fall asleep. URLs are private: the URL
printed carries the VM's token, which a browser trades for a cookie (the
token is redirected out of the address bar); scripts send Authorization:
Bearer TOKEN. --public opens it to anyone who can reach the listener.
--rotate, and --private, close every connection open through the URL.
For pages you do not trust, use host URLs (den daemon --http-domain): path
URLs share one origin.

Examples:
   den url box
   den url box --port 3000
   den url box --public
   curl -H "Authorization: Bearer $(den url box --json | jq -r .token)" http://127.0.0.1:8081/vm/box/
   curl -L -b '' "$(den url box)"              # curl keeps the cookie across the redirect`,
		Flags: withDaemon(jsonFlag(),
			&cli.IntFlag{Name: "port", Usage: "the VM's port the URL reaches (1-65535)"},
			&cli.BoolFlag{Name: "public", Usage: "no token needed"},
			&cli.BoolFlag{Name: "private", Usage: "a token needed again; open connections are closed"},
			&cli.BoolFlag{Name: "rotate", Usage: "a new token: URLs given out before stop working, connections they opened are closed"},
		),
		Action: func(c *cli.Context) error {
			name, err := oneName(c)
			if err != nil {
				return err
			}
			if c.Bool("public") && c.Bool("private") {
				return usageExit(c, "--public and --private exclude each other")
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			var u api.URLInfo
			if c.IsSet("port") || c.Bool("public") || c.Bool("private") || c.Bool("rotate") {
				req := api.URLRequest{Rotate: c.Bool("rotate")}
				if c.IsSet("port") {
					p := c.Int("port")
					if p < 1 || p > 65535 {
						return usageExit(c, "--port %d: a port is 1 to 65535", p)
					}
					req.Port = &p
				}
				if c.Bool("public") || c.Bool("private") {
					pub := c.Bool("public")
					req.Public = &pub
				}
				u, err = cl.SetURL(c.Context, name, req)
			} else {
				u, err = cl.URL(c.Context, name)
			}
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, u)
			}
			if u.URL == "" {
				return fmt.Errorf("the daemon serves no VM URLs: start it with --http-listen ADDR (port %d of %s, token %s)", u.Port, name, u.Token)
			}
			fmt.Fprintln(c.App.Writer, u.URL)
			return nil
		},
	}
}
