// Command den manages long-lived microVMs that keep their disk and memory,
// sleep when idle and wake when reached.
package main

import (
	"context"
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
	os.Exit(Run(context.Background(), Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}, os.Args))
}

// newApp is den's command line for one run (env): its verbs and their
// flags, all new, and its streams. Errors are returned, never printed
// (Run prints them).
func newApp(env *Env) *cli.App {
	app := &cli.App{
		Name:    "den",
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
   den tokens add laptop        # the API over TLS (den daemon --api-listen)
   den audit --since 1h         # who did what
   den ls
   den rm box
   den doctor                   # what this host offers den

Flags go before or after a verb's arguments; a flag den does not know is
an error. After --, and after the command of den exec, every word is an
argument.`,
		Commands: []*cli.Command{
			createCommand(), lsCommand(), infoCommand(), execCommand(), sshCommand(), logsCommand(), rmCommand(),
			checkpointCommand(), checkpointsCommand(), restoreCommand(), forkCommand(), diffCommand(), activityCommand(), sleepCommand(), wakeCommand(), moveCommand(),
			forwardCommand(), urlCommand(), netCommand(),
			resizeCommand(), dfCommand(), gcCommand(), hostsCommand(), fenceCommand(),
			keysCommand(), tokensCommand(), secretsCommand(), auditCommand(),
			mcpCommand(),
			daemonCommand(), doctorCommand(), benchCommand(),
		},
		HideHelpCommand: true,
		OnUsageError:    onUsageError,
		Reader:          env.Stdin,
		Writer:          env.Stdout,
		ErrWriter:       env.Stderr,
		ExitErrHandler:  func(*cli.Context, error) {},
		Metadata:        map[string]any{envKey: env},
	}
	setUsageErrors(app.Commands)
	return app
}
