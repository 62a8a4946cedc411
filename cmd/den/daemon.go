package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/api"
	"github.com/denhq/den/daemon"
	"github.com/denhq/den/image"
)

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:      "daemon",
		Usage:     "run the den daemon in the foreground (root)",
		UsageText: "den daemon [--state-dir DIR] [--socket PATH] [--volume-config FILE] [--images DIR] [--ssh-listen ADDR|off]",
		Description: `Serves the API on a unix socket (mode 0600) and the SSH gateway on
--ssh-listen (public-key logins: den keys add). VMs keep running when the
daemon stops; the next daemon adopts them. See docs/api.md and den.service.

Examples:
   den daemon
   den daemon --state-dir /tmp/den --socket /tmp/den/den.sock --default-image minimal
   den daemon --ssh-listen 127.0.0.1:2222     # the SSH gateway on loopback only
   den daemon --ssh-listen off`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Value: "/var/lib/den", Usage: "den's local state"},
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, EnvVars: []string{"DEN_SOCKET"}, Usage: "API unix socket"},
			&cli.StringFlag{Name: "volume-config", Usage: "storage config (JSON); default: embedded JuiceFS volume under the state dir"},
			&cli.StringFlag{Name: "images", EnvVars: []string{image.EnvDir}, Usage: "guest image directory (make image)"},
			&cli.StringFlag{Name: "default-image", Value: image.Debian, Usage: "root filesystem for VMs created without --image"},
			&cli.StringFlag{Name: "vmm", Usage: "force a VMM: qemu or cloud-hypervisor (default: choose)"},
			&cli.DurationFlag{Name: "idle-check", Value: 5 * time.Second, Usage: "how often idle VMs are looked for"},
			&cli.StringFlag{Name: "ssh-listen", Value: daemon.DefaultSSHListen, Usage: "SSH gateway address (ssh -p 2222 VM@host); off: no gateway"},
			&cli.BoolFlag{Name: "qemu-stream-ram", Usage: "for comparison: snapshot QEMU RAM through the migration stream, without x-ignore-shared"},
			&cli.BoolFlag{Name: "restore-copy", Usage: "for comparison: Cloud Hypervisor restores copy memory instead of OnDemand"},
			&cli.BoolFlag{Name: "no-digests", Usage: "for comparison: snapshots without digests, restores without verification"},
			&cli.BoolFlag{Name: "debug", Usage: "log debug messages"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			level := slog.LevelInfo
			if c.Bool("debug") {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			slog.SetDefault(log)
			imgs := image.Dir(c.String("images"))
			if imgs != "" {
				abs, err := filepath.Abs(imgs.Path())
				if err != nil {
					return err
				}
				imgs = image.Dir(abs)
			} else {
				d, err := image.DefaultDir()
				if err != nil {
					return err
				}
				imgs = d
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			return daemon.Run(ctx, daemon.Options{
				StateDir: c.String("state-dir"), Socket: c.String("socket"), VolumeConfig: c.String("volume-config"),
				Images: imgs, DefaultImage: c.String("default-image"), VMM: c.String("vmm"), Version: version, Logger: log,
				IdleCheck: c.Duration("idle-check"), QEMUStreamRAM: c.Bool("qemu-stream-ram"), RestoreCopy: c.Bool("restore-copy"), NoDigests: c.Bool("no-digests"), SSHListen: c.String("ssh-listen"),
			})
		},
	}
}
