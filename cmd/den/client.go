package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/denhq/den/api"
)

// socketFlag is the daemon socket flag shared by every client verb.
var socketFlag = &cli.StringFlag{
	Name:    "socket",
	Usage:   "the den daemon's unix socket",
	EnvVars: []string{"DEN_SOCKET"},
	Value:   api.DefaultSocket,
}

var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON for scripts"}

func newClient(c *cli.Context) *api.Client {
	if os.Getenv("DEN_REMOTE") != "" && c.String("socket") != os.Getenv("DEN_SOCKET") {
		// Run by the SSH gateway for a remote user: the daemon is the
		// one whose socket the gateway gave ($DEN_SOCKET, which IsSet
		// counts too), never one the user names.
		fmt.Fprintln(os.Stderr, "den: --socket cannot be given through the gateway")
		os.Exit(2)
	}
	return api.NewClient(c.String("socket"))
}

// withSignals returns a context cancelled by SIGINT/SIGTERM.
func withSignals(c *cli.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal says whether stdin is a terminal.
func isTerminal() bool { return term.IsTerminal(int(os.Stdin.Fd())) }
