package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/denhq/den/api"
)

// socketFlag is the daemon socket flag. Each call makes a new flag:
// urfave/cli writes to a flag when it parses it, and runs share nothing.
func socketFlag() cli.Flag {
	return &cli.StringFlag{
		Name:    "socket",
		Usage:   "the den daemon's unix socket",
		EnvVars: []string{"DEN_SOCKET"},
		Value:   api.DefaultSocket,
	}
}

// daemonFlags are the flags of every verb that talks to the daemon: its
// socket, or its TLS API listener (--url, --token, --ca).
func daemonFlags() []cli.Flag {
	return []cli.Flag{
		socketFlag(),
		&cli.StringFlag{Name: "url", EnvVars: []string{"DEN_URL"},
			Usage: "the den daemon's TLS API listener, https://HOST:PORT (instead of --socket)"},
		&cli.StringFlag{Name: "token", EnvVars: []string{"DEN_TOKEN"},
			Usage: "the bearer token that --url authenticates with"},
		&cli.StringFlag{Name: "ca", EnvVars: []string{"DEN_CA"}, TakesFile: true,
			Usage: "PEM file of the certificate(s) that verify the daemon at --url (default: the system's roots)"},
	}
}

// withDaemon is daemonFlags followed by a verb's own flags.
func withDaemon(more ...cli.Flag) []cli.Flag { return append(daemonFlags(), more...) }

// jsonFlag is --json; a new flag each call, like socketFlag.
func jsonFlag() cli.Flag { return &cli.BoolFlag{Name: "json", Usage: "print JSON for scripts"} }

// newClient is the connection to the daemon: the run's own (the SSH
// gateway's), else the daemon at --url, else the one at --socket.
func newClient(c *cli.Context) (*api.Client, error) {
	env := envOf(c)
	if env.Client != nil {
		return env.Client, nil
	}
	if env.Remote {
		return nil, errors.New("no connection to the daemon") // Run refuses this first
	}
	u := c.String("url")
	if u == "" {
		return api.NewClient(c.String("socket")), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := c.String("ca"); ca != "" {
		data, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, usageExit(c, "--ca %s: no PEM certificate in it", ca)
		}
		cfg.RootCAs = pool
	}
	cl, err := api.NewRemoteClient(u, c.String("token"), cfg)
	if err != nil {
		return nil, usageExit(c, "%w", err)
	}
	return cl, nil
}

// withSignals returns a context cancelled by SIGINT/SIGTERM; for the
// gateway, only by the run's own context (the daemon's signals are its).
func withSignals(c *cli.Context) (context.Context, context.CancelFunc) {
	if envOf(c).Remote {
		return context.WithCancel(c.Context)
	}
	return signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
}

// printJSON writes v to w as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// stdinFd is the descriptor of the run's stdin when it is a file of this
// process, never for the gateway: -1 otherwise.
func stdinFd(c *cli.Context) int {
	if envOf(c).Remote {
		return -1
	}
	if f, ok := c.App.Reader.(*os.File); ok {
		return int(f.Fd())
	}
	return -1
}

// isTerminal says whether the run's stdin is a terminal (never for the
// gateway).
func isTerminal(c *cli.Context) bool {
	fd := stdinFd(c)
	return fd >= 0 && term.IsTerminal(fd)
}
