//go:build linux

package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/agent/guest"
	"github.com/denhq/den/agent/guest/procrec"
	"github.com/denhq/den/agent/guest/sysinit"
	"golang.org/x/sys/unix"
)

// LogPath is the agent's log in the guest (tmpfs: never on a frozen fs).
const LogPath = "/run/den-agent.log"

// procRecordSize is how many process events the agent keeps until den
// reads them (den reads them every few seconds while the VM runs).
const procRecordSize = 8192

type serveOptions struct {
	unix     string
	noVsock  bool
	noSerial bool
	debug    bool
}

// runAgent is the agent's life: set up (as init), serve, and stop on a
// signal or a poweroff request.
func runAgent(o serveOptions) int {
	pid1 := os.Getpid() == 1
	// Before anything else: Go's default for these signals is to exit,
	// and init must never exit (the kernel would panic).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR2, syscall.SIGUSR1, syscall.SIGPWR)
	absorb := make(chan os.Signal, 4)
	signal.Notify(absorb, syscall.SIGHUP)
	if pid1 {
		signal.Notify(absorb, syscall.SIGQUIT)
	}
	go func() {
		for range absorb {
		}
	}()
	var mountErr error
	if pid1 {
		mountErr = sysinit.MountAPI()
	}
	log := newLogger(pid1, o.debug)
	slog.SetDefault(log)
	log.Info("den-agent starting", "version", agent.Version, "pid1", pid1)
	if mountErr != nil {
		log.Warn("mounting API filesystems", "err", mountErr)
	}
	cmdline, err := guest.ReadCmdline("/proc/cmdline")
	if err != nil {
		log.Warn("kernel command line", "err", err)
	}
	// Before the hostname is set and the host key loaded: a fork's cold
	// boot must not come up with its source's identity.
	bootIdentity(log, pid1, cmdline)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reaper *guest.Reaper
	// The hostname comes from the command line at first boot only: a
	// service restart must not undo a fork's new identity.
	if h, _ := os.Hostname(); pid1 || h == "den" || h == "localhost" || h == "" {
		sysinit.SetHostname(log, cmdline.Hostname)
	}
	// As init or as a service (the debian image has no other network
	// configuration), the command line's static address is applied.
	if err := sysinit.ConfigureNetwork(log, sysinit.NetConfig{IP: cmdline.IP, GW: cmdline.GW, DNS: cmdline.DNS}); err != nil {
		log.Warn("network", "err", err)
	}
	if pid1 {
		reaper = guest.NewReaper(log)
		go reaper.Run(ctx)
	}
	hostKey, keyPath, err := guest.LoadOrCreateHostKey(guest.HostKeyPath, guest.RunHostKeyPath)
	if err != nil {
		log.Error("no persistent host key, using a temporary one", "err", err)
		_, hostKey, _ = agent.NewEd25519Key("den-agent")
	} else {
		log.Info("host key", "path", keyPath, "fingerprint", fingerprint(hostKey))
	}

	stop := make(chan bool, 1) // true: reboot
	sys := guest.DefaultSystem()
	sys.SetMAC = sysinit.SetMAC
	sys.SetNet = func(ifname string, c agent.NetConfig) error {
		return sysinit.Reconfigure(log, ifname, sysinit.NetConfig{IP: c.IP, GW: c.GW, DNS: []string{c.DNS}})
	}
	sys.Poweroff = func(reboot bool) {
		select {
		case stop <- reboot:
		default:
		}
	}
	rec, recErr := procrec.Open(procRecordSize, log)
	recOff := ""
	if recErr != nil {
		log.Warn("no process record", "err", recErr)
		recOff = recErr.Error()
	} else {
		defer rec.Close()
		if err := rec.WatchFiles(procrec.DefaultFilePaths); err != nil {
			log.Warn("no file record", "err", err)
		}
		if err := rec.WatchConnections(); err != nil {
			log.Warn("no connection record", "err", err)
		}
	}
	srv, err := guest.New(guest.Config{
		ProcRecord:     rec,
		ProcRecordOff:  recOff,
		HostKey:        hostKey,
		HostKeyPath:    keyPath,
		AuthorizedKeys: guest.AuthorizedKeys(guest.AuthorizedKeysPath, cmdline.Keys, log),
		System:         sys,
		Reaper:         reaper,
		Logger:         log,
	})
	if err != nil {
		log.Error("agent", "err", err)
		return halt(pid1, log, 1)
	}
	if len(cmdline.Keys) == 0 {
		if _, err := os.Stat(guest.AuthorizedKeysPath); err != nil {
			log.Warn("no authorized keys: no den.key= on the kernel command line and no " + guest.AuthorizedKeysPath)
		}
	}
	if err := srv.ServeKeyAgent(agent.KeyAgentSocket); err != nil {
		log.Warn("no ssh agent socket for den's secrets", "err", err)
	}
	if l, err := guest.ListenLeases(agent.LeaseSocket); err != nil {
		log.Warn("keep-awake leases unavailable", "err", err)
	} else {
		defer l.Close()
		go srv.Leases().ServeLeases(l, log)
	}
	if o.unix != "" {
		os.Remove(o.unix)
		l, err := net.Listen("unix", o.unix)
		if err != nil {
			log.Error("unix listener", "err", err)
			return halt(pid1, log, 1)
		}
		go srv.Serve(l)
	}
	go watchChannels(ctx, srv, log, o)

	reboot, byHost := false, false
	select {
	case sig := <-sigs:
		log.Info("stopping", "signal", sig.String())
	case reboot = <-stop:
		byHost = true
	}
	srv.Close()
	cancel()
	switch {
	case pid1:
		sysinit.Shutdown(log, reboot)
	case byHost:
		systemPoweroff(log, reboot)
	}
	return 0
}

// bootIdentity gives the guest a new identity when the kernel command
// line's den.identity differs from the one recorded in /etc/den/identity
// and the initramfs did not (an older initramfs, or none). Only as init,
// before anything else runs: as a service the agent starts after systemd
// has read the old identity, and after a memory restore /proc/cmdline is
// still the source VM's.
func bootIdentity(log *slog.Logger, pid1 bool, c guest.Cmdline) {
	if c.Identity == "" {
		return
	}
	if !pid1 {
		if cur := guest.ReadIdentityToken("/"); cur != c.Identity {
			log.Info("den.identity differs from "+guest.IdentityPath+"; not init, so left to the initramfs", "den.identity", c.Identity, "recorded", cur)
		}
		return
	}
	made, err := guest.ApplyBootIdentity(context.Background(), "/", c.Identity, c.Hostname)
	switch {
	case errors.Is(err, guest.ErrReadOnlyRoot):
		log.Warn("read-only root: no new identity for this boot", "den.identity", c.Identity)
	case err != nil:
		log.Error("new identity", "err", err)
	case made:
		log.Info("new identity", "hostname", c.Hostname, "den.identity", c.Identity)
	}
}

// watchChannels opens the vsock listener and the serial port as they
// appear (their drivers may load after the agent starts) and reopens them
// if they fail.
func watchChannels(ctx context.Context, srv *guest.Server, log *slog.Logger, o serveOptions) {
	var vsockUp, serialUp atomic.Bool
	vsockUp.Store(o.noVsock)
	serialUp.Store(o.noSerial)
	start, warned := time.Now(), false
	for ctx.Err() == nil {
		if !vsockUp.Load() {
			if l, err := guest.ListenVsock(agent.Port); err == nil {
				vsockUp.Store(true)
				log.Info("listening on vsock", "port", agent.Port)
				go func() {
					if err := srv.Serve(l); err != nil {
						log.Warn("vsock", "err", err)
						vsockUp.Store(false)
					}
				}()
			}
		}
		if !serialUp.Load() {
			if f, err := guest.OpenSerialPort("/sys/class/virtio-ports", agent.SerialPortName); err == nil {
				serialUp.Store(true)
				log.Info("serving the virtio-serial port", "name", agent.SerialPortName, "dev", f.Name())
				go func() {
					if err := srv.ServePort(ctx, f); err != nil {
						log.Warn("serial port", "err", err)
					}
					serialUp.Store(false)
				}()
			}
		}
		delay := 100 * time.Millisecond
		if time.Since(start) > 30*time.Second {
			delay = time.Second
		}
		if !warned && time.Since(start) > 10*time.Second && !(vsockUp.Load() && serialUp.Load()) {
			log.Warn("guest channel still missing", "vsock", vsockUp.Load(), "serial", serialUp.Load())
			warned = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// systemPoweroff stops a guest where the agent is not init.
func systemPoweroff(log *slog.Logger, reboot bool) {
	verb := "poweroff"
	if reboot {
		verb = "reboot"
	}
	for _, argv := range [][]string{{"systemctl", verb}, {verb}} {
		if p, err := exec.LookPath(argv[0]); err == nil {
			if err := exec.Command(p, argv[1:]...).Run(); err == nil {
				return
			} else {
				log.Warn(verb, "command", argv, "err", err)
			}
		}
	}
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if reboot {
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	if err := unix.Reboot(cmd); err != nil {
		log.Error(verb, "err", err)
	}
}

// halt: init must never exit (the kernel would panic), so it idles.
func halt(pid1 bool, log *slog.Logger, code int) int {
	if pid1 {
		log.Error("den-agent cannot serve; idling as init")
		select {}
	}
	return code
}

// newLogger logs to the console (init) or stderr, and to LogPath.
func newLogger(pid1, debug bool) *slog.Logger {
	var out io.Writer = lenient{os.Stderr}
	if pid1 {
		if c, err := os.OpenFile("/dev/console", os.O_WRONLY|syscall.O_NOCTTY, 0); err == nil {
			out = lenient{c}
		}
	}
	if f, err := os.OpenFile(LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
		out = io.MultiWriter(out, &capped{f: f, max: 8 << 20})
	}
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
}

// lenient ignores write errors, so that one broken log output does not
// silence the others.
type lenient struct{ w io.Writer }

func (l lenient) Write(p []byte) (int, error) {
	l.w.Write(p)
	return len(p), nil
}

// capped stops writing to a file past max bytes (it lives in RAM).
type capped struct {
	f   *os.File
	n   int64
	max int64
}

func (c *capped) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.max {
		return len(p), nil
	}
	n, _ := c.f.Write(p)
	c.n += int64(n)
	return len(p), nil
}
