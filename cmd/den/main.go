// Command den manages long-lived microVMs that keep their disk and memory,
// sleep when idle and wake when reached.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/vmm"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	vmm.RunShim() // den __vmm-exec ...: a VMM's launcher, never returns
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	app := newApp()
	args, err := parseArgs(app, os.Args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintln(os.Stderr, "den: "+err.Error())
		os.Exit(exitCode(err))
	}
}

// newApp is den's command line: its verbs and their flags.
func newApp() *cli.App {
	app := &cli.App{
		Name:    "den",
		Before:  func(*cli.Context) error { return checkOwnerEnv() },
		Usage:   "long-lived microVMs that keep their disk and memory",
		Version: version,
		Description: `den runs each VM as a real computer that keeps its disk and memory,
sleeps when idle and wakes when reached.

Examples:
   den daemon &                 # as root; see den daemon --help
   den create box
   den exec box -- uname -a
   den ssh box
   den checkpoint box -m "deps installed"
   den restore box cp-1
   den fork box@cp-1 box2
   den sleep box
   den keys add ~/.ssh/id_ed25519.pub   # then: ssh -p 2222 box@host
   den ls
   den rm box
   den doctor                   # what this host offers den

Flags go before or after a verb's arguments; a flag den does not know is
an error. After --, and after the command of den exec, every word is an
argument.`,
		Commands: []*cli.Command{
			createCommand(), lsCommand(), infoCommand(), execCommand(), sshCommand(), logsCommand(), rmCommand(),
			checkpointCommand(), checkpointsCommand(), restoreCommand(), forkCommand(), sleepCommand(), wakeCommand(),
			forwardCommand(), urlCommand(), netCommand(),
			resizeCommand(),
			keysCommand(),
			daemonCommand(), doctorCommand(), benchCommand(),
		},
		HideHelpCommand: true,
		OnUsageError:    onUsageError,
	}
	setUsageErrors(app.Commands)
	return app
}

// exitCode passes through an exit status that a verb asked for (den exec)
// and is 1 for any other error.
func exitCode(err error) int {
	if ec, ok := err.(cli.ExitCoder); ok && ec.ExitCode() != 0 {
		return ec.ExitCode()
	}
	return 1
}
