//go:build linux

// Command den-agent is the den guest agent: an SSH server on the guest
// channel (vsock port 1024 and/or the virtio-serial port org.den.agent)
// for the den daemon, see package agent. It runs as a systemd service
// (den-agent.service, installed as /usr/sbin/den-agent), or as init.
//
//	den-agent [serve] [--unix PATH] [--no-vsock] [--no-serial] [--debug]
//	den-agent hold [--for DURATION] [--name NAME]
//	den-agent release [--name NAME]
//	den-agent status
//	den-agent version
//
// As init (PID 1, e.g. /sbin/init in a busybox image) it mounts /proc,
// /sys, /dev, /dev/pts, /dev/shm, /run and /tmp, remounts / read-write,
// sets the hostname (den.hostname= or /etc/hostname), brings lo up and
// configures eth0 from den.ip=ADDR/PREFIX den.gw=GW den.dns=IP[,IP], reaps
// orphans, and on SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGPWR or a poweroff
// request stops every process, syncs, unmounts and powers off. serve's
// flags may follow "--" on the kernel command line. The root file system
// must provide /dev/console and /dev/null (or an initramfs must mount
// /dev): the Go runtime opens /dev/null for missing standard descriptors.
//
// Its log goes to stderr (as init: /dev/console) and /run/den-agent.log.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/agent/guest"
)

func main() {
	// As init, the arguments are whatever the kernel did not understand
	// (and what follows "--" on its command line): serve's flags are
	// picked out, the rest ignored.
	if os.Getpid() == 1 || filepath.Base(os.Args[0]) == "init" {
		os.Exit(runAgent(initOptions(os.Args[1:])))
	}
	cmd, args := "serve", os.Args[1:]
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	os.Exit(run(cmd, args))
}

func run(cmd string, args []string) int {
	fs := flag.NewFlagSet("den-agent "+cmd, flag.ContinueOnError)
	switch cmd {
	case "serve":
		var o serveOptions
		fs.StringVar(&o.unix, "unix", "", "also serve SSH on this unix socket (for debugging)")
		fs.BoolVar(&o.noVsock, "no-vsock", false, "do not listen on vsock")
		fs.BoolVar(&o.noSerial, "no-serial", false, "do not serve the virtio-serial port")
		fs.BoolVar(&o.debug, "debug", false, "log debug messages")
		if fs.Parse(args) != nil {
			return 2
		}
		return runAgent(o)
	case "hold":
		d := fs.Duration("for", 0, "hold for this long (default: until released)")
		name := fs.String("name", "default", "lease name")
		if fs.Parse(args) != nil {
			return 2
		}
		return leaseCmd(agent.LeaseRequest{Op: "hold", Name: *name, ForMS: d.Milliseconds()})
	case "release":
		name := fs.String("name", "default", "lease name")
		if fs.Parse(args) != nil {
			return 2
		}
		return leaseCmd(agent.LeaseRequest{Op: "release", Name: *name})
	case "status":
		if fs.Parse(args) != nil {
			return 2
		}
		return leaseCmd(agent.LeaseRequest{Op: "list"})
	case "version":
		fmt.Println("den-agent", agent.Version)
		return 0
	case "help":
		fmt.Println("usage: den-agent [serve|hold [--for D]|release|status|version] [flags]")
		return 0
	}
	fmt.Fprintf(os.Stderr, "den-agent: unknown command %q (serve, hold, release, status, version)\n", cmd)
	return 2
}

// initOptions picks serve's flags out of init's arguments.
func initOptions(args []string) serveOptions {
	var o serveOptions
	for i := 0; i < len(args); i++ {
		if !strings.HasPrefix(args[i], "-") {
			continue
		}
		switch a := strings.TrimLeft(args[i], "-"); {
		case a == "no-vsock":
			o.noVsock = true
		case a == "no-serial":
			o.noSerial = true
		case a == "debug":
			o.debug = true
		case strings.HasPrefix(a, "unix="):
			o.unix = strings.TrimPrefix(a, "unix=")
		case a == "unix" && i+1 < len(args):
			o.unix = args[i+1]
			i++
		}
	}
	return o
}

// leaseCmd talks to the running agent's lease socket and prints the
// leases in force.
func leaseCmd(req agent.LeaseRequest) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := guest.LeaseCall(ctx, agent.LeaseSocket, req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "den-agent: %v\n", err)
		return 1
	}
	if len(rep.Leases) == 0 {
		fmt.Println("no keep-awake leases")
	}
	for _, l := range rep.Leases {
		until := "until released"
		if !l.Until.IsZero() {
			until = "until " + l.Until.Format(time.RFC3339)
		}
		fmt.Printf("%s\t%s\n", l.Name, until)
	}
	return 0
}
