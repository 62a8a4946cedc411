package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/api"
	"github.com/denhq/den/daemon"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/size"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/memstore"
	"github.com/denhq/den/network"
)

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:      "daemon",
		Usage:     "run the den daemon in the foreground (root)",
		UsageText: "den daemon [--state-dir DIR] [--socket PATH] [--volume-config FILE | --cluster FILE] [--images DIR] [--ssh-listen ADDR|off]",
		Description: `Serves the API on a unix socket every local user may use (the daemon
learns each caller's uid from the connection: root and --admin-group members
administer, anyone else has their own VMs), the SSH gateway on --ssh-listen
(public-key logins: den keys add) and, with --api-listen, the API over TLS
for bearer tokens. VMs keep running when the daemon stops; the next daemon
adopts them. See docs/api.md and den.service.

Examples:
   den daemon
   den daemon --state-dir /tmp/den --socket /tmp/den/den.sock --default-image minimal
   den daemon --ssh-listen 127.0.0.1:2222     # the SSH gateway on loopback only
   den daemon --ssh-listen off
   den daemon --memory-budget 75%             # guest RAM den commits at most
   den daemon --memory-budget 12G --memory-pressure 20
   den daemon --http-listen 127.0.0.1:8081    # VM URLs: den url box
   den daemon --api-listen 0.0.0.0:7443       # the API over TLS: den tokens add laptop
   den daemon --e2b-listen 127.0.0.1:3000     # E2B SDKs: E2B_API_URL=E2B_SANDBOX_URL=http://127.0.0.1:3000 (docs/e2b.md)
   den daemon --egress-default allow:github.com,pypi.org
   den daemon --netns den                     # TAPs, NAT and listeners in netns "den" (ip netns add den)
   den daemon --cluster /etc/den/cluster.json # the registry in PostgreSQL, the volume shared (docs/cluster.md)`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Value: "/var/lib/den", Usage: "den's local state"},
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, EnvVars: []string{"DEN_SOCKET"}, Usage: "API unix socket"},
			&cli.StringFlag{Name: "volume-config", Usage: "storage config (JSON); default: embedded JuiceFS volume under the state dir"},
			&cli.StringFlag{Name: "cluster", Usage: "cluster config (JSON, docs/cluster.md): the registry in PostgreSQL and the volume shared with other hosts"},
			&cli.StringFlag{Name: "images", EnvVars: []string{image.EnvDir}, Usage: "guest image directory (make image)"},
			&cli.StringFlag{Name: "default-image", Value: image.Debian, Usage: "root filesystem for VMs created without --image"},
			&cli.StringFlag{Name: "vmm", Usage: "force a VMM: qemu or cloud-hypervisor (default: choose)"},
			&cli.DurationFlag{Name: "idle-check", Value: 5 * time.Second, Usage: "how often idle VMs are looked for"},
			&cli.StringFlag{Name: "ssh-listen", Value: daemon.DefaultSSHListen, Usage: "SSH gateway address (ssh -p 2222 VM@host); off: no gateway"},
			&cli.BoolFlag{Name: "qemu-stream-ram", Usage: "for comparison: snapshot QEMU RAM through the migration stream, without x-ignore-shared"},
			&cli.BoolFlag{Name: "restore-copy", Usage: "for comparison: Cloud Hypervisor restores copy memory instead of OnDemand"},
			&cli.BoolFlag{Name: "no-digests", Usage: "for comparison: snapshots without digests, restores without verification"},
			&cli.BoolFlag{Name: "memory-files", Usage: "for comparison: each snapshot's memory a file of its own, not stored by content"},
			&cli.DurationFlag{Name: "gc-grace", Value: memstore.DefaultGrace, Usage: "the memory store keeps packs no snapshot names for this long after they were written"},
			&cli.IntFlag{Name: "max-wakes", Value: machine.DefaultMaxWakes, Usage: "VMs woken or booted at once; more wait their turn (at most " + machine.DefaultWakeWait.String() + ", then a one-line refusal), as after a cluster host's loss"},
			&cli.StringFlag{Name: "ram-dir", Usage: "where guest RAM files go (default: a tmpfs den mounts at STATE/ram)"},
			&cli.StringFlag{Name: "activity-cap", Value: size.Format(activity.DefaultCap), Usage: "how much of the volume each VM's activity record (den activity) may take; the oldest half goes beyond it"},
			&cli.DurationFlag{Name: "activity-pull", Value: machine.DefaultRecordPull, Usage: "how often a running VM's process record is read into its activity record (also read before a sleep, checkpoint or restore, and by den activity)"},
			&cli.StringFlag{Name: "memory-copies", Value: size.Format(machine.DefaultMemoryCopies), Usage: "disk in the state dir den may fill with local copies of snapshots' memory, which wakes and restores read instead of the volume's; 0: none"},
			&cli.StringFlag{Name: "memory-budget", Usage: "guest RAM (plus --vmm-overhead per VM) den commits at most: a size (12G), a share of the host's RAM (75%) or off; " +
				"a start that would exceed it first puts the least recently active idle VMs to sleep (default: 80% of the host's RAM, leaving it at least 1 GiB)"},
			&cli.StringFlag{Name: "vmm-overhead", Value: size.Format(machine.DefaultVMMOverhead), Usage: "memory a VMM process takes beside its guest's RAM, counted per VM against the budget"},
			&cli.Float64Flag{Name: "memory-pressure", Value: machine.DefaultPressureSome, Usage: "host memory pressure (PSI some avg10, percent) at which idle VMs are put to sleep; 0: ignore PSI"},
			&cli.StringFlag{Name: "memory-min-available", Value: fmt.Sprintf("%d%%", machine.DefaultMinAvailablePercent), Usage: "host MemAvailable under which idle VMs are put to sleep: a size, a share of the host's RAM, or off"},
			&cli.DurationFlag{Name: "memory-pressure-cooldown", Value: machine.DefaultPressureCooldown, Usage: "least time between two sleeps for memory pressure"},
			&cli.StringFlag{Name: "net", Value: machine.NetAuto, Usage: "how VMs reach the network: tap (a TAP and a routed subnet each, NAT and egress policy through nftables), user (QEMU's user-mode network), auto (tap where possible)"},
			&cli.StringFlag{Name: "net-pool", Value: network.DefaultPool, Usage: "where VMs' subnets (a /30 each) come from"},
			&cli.StringSliceFlag{Name: "dns-upstream", Usage: "resolver (host[:port]) the VMs' resolver asks; repeat for more (default: the host's /etc/resolv.conf)"},
			&cli.StringFlag{Name: "egress-default", Value: "allow-all", Usage: "egress policy of VMs created without --egress: allow-all, deny-all, allow:LIST or deny:LIST[;allow:LIST]"},
			&cli.StringFlag{Name: "netns", Usage: "run in this network namespace (a name from ip netns, or a path): VMs' TAPs, NAT and the listeners live there"},
			&cli.StringFlag{Name: "http-listen", Value: "off", Usage: "serve VMs' URLs (den url) on this address; off: none"},
			&cli.StringFlag{Name: "http-domain", Usage: "route Host NAME.DOMAIN to VM NAME on --http-listen (else only /vm/NAME/ paths)"},
			&cli.StringFlag{Name: "tls-cert", Usage: "certificate file: --http-listen serves HTTPS"},
			&cli.StringFlag{Name: "tls-key", Usage: "key file of --tls-cert"},
			&cli.StringFlag{Name: "api-listen", Value: "off", Usage: "serve the API over TLS on this address too, for bearer tokens (den tokens add); off: none"},
			&cli.StringFlag{Name: "api-tls-cert", Usage: "certificate file of --api-listen (default: a self-signed one, made once in the state dir)"},
			&cli.StringFlag{Name: "api-tls-key", Usage: "key file of --api-tls-cert"},
			&cli.StringFlag{Name: "e2b-listen", Value: "off", Usage: "serve E2B's API (control plane and envd) on this address, for the official E2B SDKs with a den token as E2B_API_KEY: HTTP on loopback, else TLS as --api-listen; off: none"},
			&cli.StringFlag{Name: "e2b-domain", Usage: "the domain of E2B sandboxes' host names (PORT-ID.DOMAIN, what sandbox.getHost gives; point *.DOMAIN at the E2B listener); default: localhost:PORT for a loopback --e2b-listen"},
			&cli.StringFlag{Name: "secrets-ca", Usage: "a PEM file of authorities den trusts, besides the system's, for the hosts of HTTPS secrets"},
			&cli.StringFlag{Name: "vmm-user", Value: "den-vm", Usage: "the unprivileged user VMMs run as (made when missing); - runs them as root"},
			&cli.StringFlag{Name: "admin-group", Value: daemon.DefaultAdminGroup, Usage: "local group whose members administer den through the socket, as root does"},
			&cli.BoolFlag{Name: "debug", Usage: "log debug messages"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if err := enterNetns(c.String("netns")); err != nil {
				return cli.Exit("den daemon: "+err.Error(), 1)
			}
			level := slog.LevelInfo
			if c.Bool("debug") {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level}))
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
			mem, err := memoryConfig(c)
			if err != nil {
				return err
			}
			nc, err := networkConfig(c)
			if err != nil {
				return err
			}
			actCap, err := size.Parse(c.String("activity-cap"))
			if err != nil || actCap < 64<<10 {
				return usageExit(c, "--activity-cap %q: give a size of 64KiB or more", c.String("activity-cap"))
			}
			if c.Duration("activity-pull") <= 0 {
				return usageExit(c, "--activity-pull: give a duration above 0")
			}
			copies, err := size.Parse(c.String("memory-copies"))
			if err != nil {
				return usageExit(c, "--memory-copies: %v", err)
			}
			if copies == 0 {
				copies = -1 // none (machine.Config's 0 is the default)
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			return daemon.Run(ctx, daemon.Options{
				StateDir: c.String("state-dir"), Socket: c.String("socket"), VolumeConfig: c.String("volume-config"), ClusterConfig: c.String("cluster"),
				Images: imgs, DefaultImage: c.String("default-image"), VMM: c.String("vmm"), Version: version, Logger: log,
				IdleCheck: c.Duration("idle-check"), MaxWakes: c.Int("max-wakes"), QEMUStreamRAM: c.Bool("qemu-stream-ram"), RestoreCopy: c.Bool("restore-copy"), NoDigests: c.Bool("no-digests"),
				MemoryFiles: c.Bool("memory-files"), CollectGrace: c.Duration("gc-grace"), ActivityCap: actCap, ActivityPull: c.Duration("activity-pull"), RAMDir: c.String("ram-dir"), SSHListen: c.String("ssh-listen"),
				Memory: mem, Network: nc, MemoryCopies: copies,
				HTTPListen: c.String("http-listen"), HTTPDomain: c.String("http-domain"), TLSCert: c.String("tls-cert"), TLSKey: c.String("tls-key"),
				APIListen: c.String("api-listen"), APITLSCert: c.String("api-tls-cert"), APITLSKey: c.String("api-tls-key"), E2BListen: c.String("e2b-listen"), E2BDomain: c.String("e2b-domain"),
				AdminGroup: c.String("admin-group"), Den: RunRemote, VMUser: c.String("vmm-user"), SecretsCA: c.String("secrets-ca"),
			})
		},
	}
}

// networkConfig reads the network flags.
func networkConfig(c *cli.Context) (machine.NetworkConfig, error) {
	nc := machine.NetworkConfig{Mode: c.String("net")}
	switch nc.Mode {
	case machine.NetAuto, machine.NetTap, machine.NetUser:
	default:
		return nc, usageExit(c, "--net %q: use auto, tap or user", nc.Mode)
	}
	pool, err := network.ParsePool(c.String("net-pool"))
	if err != nil {
		return nc, usageExit(c, "--net-pool: %w", err)
	}
	nc.Pool = pool
	for _, u := range c.StringSlice("dns-upstream") {
		hp, err := network.ParseUpstream(u)
		if err != nil {
			return nc, usageExit(c, "--dns-upstream: %w", err)
		}
		nc.DNSUpstreams = append(nc.DNSUpstreams, hp)
	}
	if nc.DefaultEgress, err = egress.Parse(c.String("egress-default")); err != nil {
		return nc, usageExit(c, "--egress-default: %w", err)
	}
	if d := c.String("http-domain"); d != "" {
		if _, err := egress.Parse("allow:" + d); err != nil || strings.Contains(d, "*") || strings.Contains(d, ",") {
			return nc, usageExit(c, "--http-domain %q: want a domain name such as den.example.org", d)
		}
	}
	return nc, nil
}

// memoryConfig reads the memory budget and pressure flags.
func memoryConfig(c *cli.Context) (machine.MemoryConfig, error) {
	var mc machine.MemoryConfig
	total, err := machine.HostMemTotal()
	if err != nil {
		total = -1
	}
	if v := c.String("memory-budget"); v != "" {
		if mc.Budget, err = machine.ParseMemoryAmount(v, total); err != nil {
			return mc, usageExit(c, "--memory-budget: %v", err)
		}
	}
	if mc.VMMOverhead, err = size.Parse(c.String("vmm-overhead")); err != nil {
		return mc, usageExit(c, "--vmm-overhead: %v", err)
	}
	switch p := c.Float64("memory-pressure"); {
	case p < 0 || p > 100:
		return mc, usageExit(c, "--memory-pressure %g: a percentage from 0 (ignore PSI) to 100", p)
	case p == 0:
		mc.PressureSome = -1
	default:
		mc.PressureSome = p
	}
	if mc.MinAvailable, err = machine.ParseMemoryAmount(c.String("memory-min-available"), total); err != nil {
		return mc, usageExit(c, "--memory-min-available: %v", err)
	}
	if mc.PressureCooldown = c.Duration("memory-pressure-cooldown"); mc.PressureCooldown <= 0 {
		return mc, usageExit(c, "--memory-pressure-cooldown must be more than 0")
	}
	return mc, nil
}
