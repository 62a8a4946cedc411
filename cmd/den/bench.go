package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/denhq/den/bench"
	"github.com/denhq/den/image"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:      "bench",
		Usage:     "measure den's headline numbers (medians over several runs)",
		UsageText: "den bench [--quick] [--network] [--scale [--cluster FILE]] [--activity] [--e2b [--e2b-sdk DIR]] [--breakdown] [--runs N] [--image NAME] [--vmm NAME]... [--json] [--out DIR]",
		Description: `Starts a den daemon of its own on a temporary state dir (root), and measures
create (cold and from the warm base), checkpoint, restore, sleep, wake, ssh
through the gateway and disk clones, for each VMM present. Writes the figures
to DIR as JSON and Markdown (docs/benchmarks.md explains them).

Examples:
   den bench --quick
   den bench --network --runs 3     # only the network figures (tap vs user-mode, URLs, DNS)
   den bench --scale --runs 3       # only a host with 1,000 sleeping VMs (--quick: 100)
   den bench --scale --cluster host-s.json   # the same on a new host of a cluster (its PostgreSQL and volume)
   den bench --activity --runs 7    # only what the guest's activity record costs (a build, record on and off)
   den bench --e2b --runs 20        # only the E2B SDK against den's own path (node and make deps-node)
   den bench --quick --breakdown    # and where each operation's time goes
   den bench --runs 7 --json > result.json`,
		Flags: []cli.Flag{
			jsonFlag(),
			&cli.BoolFlag{Name: "quick", Usage: "3 runs, no 2 GiB ratios, no gateway (5-10 minutes on 2 cores under TCG)"},
			&cli.BoolFlag{Name: "network", Usage: "only the network figures (in network namespaces of their own; root)"},
			&cli.BoolFlag{Name: "scale", Usage: "only a host with many sleeping VMs: daemon start, den ls, daemon memory"},
			&cli.StringFlag{Name: "cluster", Usage: "with --scale: the daemon joins the cluster this config describes (as den daemon --cluster; its host must not be running)", TakesFile: true},
			&cli.BoolFlag{Name: "activity", Usage: "only the activity record's cost: a C build and the worst case, timed with the record on and off in turn"},
			&cli.BoolFlag{Name: "e2b", Usage: "only the official e2b SDK (--e2b-listen) beside den's own path: create, pause and connect to first output, fork x4 and x16; p50 and p99 (default 20 runs)"},
			&cli.StringFlag{Name: "e2b-sdk", Value: "e2e/e2bsdk", Usage: "directory of bench.mjs and the e2b SDK's node_modules (--e2b)"},
			&cli.BoolFlag{Name: "breakdown", Usage: "each timed operation's steps, as the daemon traced them: where every millisecond goes"},
			&cli.IntFlag{Name: "runs", Usage: "runs per figure after a warm-up (default 5, quick 3, e2b 20)"},
			&cli.StringFlag{Name: "image", Value: image.Minimal, Usage: "guest image (--e2b: debian, for the SDK's /bin/bash)"},
			&cli.StringSliceFlag{Name: "vmm", Usage: "VMMs to measure (default: every one present)"},
			&cli.StringFlag{Name: "images", EnvVars: []string{image.EnvDir}, Usage: "guest image directory"},
			&cli.StringFlag{Name: "out", Value: "bench/results", Usage: "where results are written"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if n := btoi(c.Bool("network")) + btoi(c.Bool("scale")) + btoi(c.Bool("activity")) + btoi(c.Bool("e2b")); n > 1 {
				return cli.Exit("den bench: --network, --scale, --activity and --e2b are modes of their own: give one", 2)
			}
			cfg := c.String("cluster")
			if cfg != "" && !c.Bool("scale") {
				return cli.Exit("den bench: --cluster goes with --scale", 2)
			}
			if cfg != "" {
				abs, err := filepath.Abs(cfg)
				if err != nil {
					return err
				}
				cfg = abs
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			imgs := c.String("images")
			if imgs == "" {
				d, err := image.DefaultDir()
				if err != nil {
					return err
				}
				imgs = d.Path()
			}
			if imgs, err = filepath.Abs(imgs); err != nil {
				return err
			}
			img := c.String("image")
			if c.Bool("e2b") && !c.IsSet("image") {
				img = image.Debian // the SDK runs every command with /bin/bash, which minimal has not
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			res, err := bench.Run(ctx, bench.Options{
				Den: self, Images: imgs, Image: img, Runs: c.Int("runs"), Quick: c.Bool("quick"), NetworkOnly: c.Bool("network"), ScaleOnly: c.Bool("scale"), Cluster: cfg, ActivityOnly: c.Bool("activity"), E2BOnly: c.Bool("e2b"), E2BSDK: c.String("e2b-sdk"), Breakdown: c.Bool("breakdown"),
				VMMs:     c.StringSlice("vmm"),
				Progress: func(s string) { fmt.Fprintln(c.App.ErrWriter, "bench: "+s) },
			})
			if err != nil {
				return err
			}
			path, err := bench.Save(c.String("out"), res)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.ErrWriter, "bench: results in "+path+" (and .md)")
			if c.Bool("json") {
				return printJSON(c.App.Writer, res)
			}
			return bench.WriteTable(c.App.Writer, res)
		},
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
