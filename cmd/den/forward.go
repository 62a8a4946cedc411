package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/crypto/ssh"
)

func forwardCommand() *cli.Command {
	return &cli.Command{
		Name:      "forward",
		Usage:     "forward local TCP ports to ports inside a VM, like ssh -L",
		ArgsUsage: "NAME [LOCAL:]PORT...",
		UsageText: "den forward NAME [--listen ADDR] [LOCAL:]PORT [[LOCAL:]PORT...]",
		Description: `Listens on 127.0.0.1:LOCAL (LOCAL is PORT unless given) and carries each
connection to 127.0.0.1:PORT inside the VM, until Ctrl-C. A stopped or
sleeping VM is started first, and stays awake while den forward runs. If
the VM stops, den forward says so and exits with status 1.

Examples:
   den forward box 3000                   # localhost:3000 -> box:3000
   den forward box 8080:80 5432           # localhost:8080 -> box:80, localhost:5432 -> box:5432
   den forward box 3000 --listen 0.0.0.0  # other hosts may connect too`,
		Flags: withDaemon(
			&cli.StringFlag{Name: "listen", Usage: "the local address (host) to listen on", Value: "127.0.0.1"},
		),
		Action: func(c *cli.Context) error {
			name, err := needName(c)
			if err != nil {
				return err
			}
			if c.NArg() < 2 {
				return usageExit(c, "missing PORT: den forward NAME [LOCAL:]PORT...")
			}
			fwds, err := parseForwards(c.Args().Tail())
			if err != nil {
				return usageExit(c, "%w", err)
			}
			host := c.String("listen")
			if _, _, err := net.SplitHostPort(host); err == nil || host == "" {
				return usageExit(c, "--listen %q: give a host or IP address, without a port", host)
			}
			ctx, cancel := withSignals(c)
			defer cancel()
			return runForward(ctx, c, name, host, fwds)
		},
	}
}

// portForward is one [LOCAL:]PORT: local port on this host, port in the VM.
type portForward struct {
	local, remote int
}

// parseForwards parses the [LOCAL:]PORT arguments of den forward; a
// local port may be given once.
func parseForwards(args []string) ([]portForward, error) {
	var out []portForward
	seen := map[int]bool{}
	for _, a := range args {
		f, err := parseForward(a)
		if err != nil {
			return nil, err
		}
		if seen[f.local] {
			return nil, fmt.Errorf("local port %d is given twice", f.local)
		}
		seen[f.local] = true
		out = append(out, f)
	}
	return out, nil
}

// parseForward parses PORT or LOCAL:PORT.
func parseForward(arg string) (portForward, error) {
	local, remote, hasLocal := strings.Cut(arg, ":")
	if !hasLocal {
		remote = local
	}
	lp, lok := parsePort(local)
	rp, rok := parsePort(remote)
	if !lok || !rok {
		return portForward{}, fmt.Errorf("bad port %q: use PORT or LOCAL:PORT, each a number from 1 to 65535", arg)
	}
	return portForward{local: lp, remote: rp}, nil
}

// parsePort parses a TCP port, 1-65535, in decimal digits only.
func parsePort(s string) (int, bool) {
	if s == "" || len(s) > 5 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 1 && n <= 65535
}

// runForward listens on every local port, then connects to the VM and
// carries connections until ctx ends (nil) or the VM's connection breaks
// (an error).
func runForward(ctx context.Context, c *cli.Context, name, host string, fwds []portForward) error {
	lns := make([]net.Listener, 0, len(fwds))
	closeAll := func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}
	defer closeAll()
	for _, f := range fwds {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(f.local)))
		if err != nil {
			return fmt.Errorf("forward %s: %w", name, err)
		}
		lns = append(lns, ln)
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	client, err := cl.SSH(ctx, name)
	if err != nil {
		return err
	}
	defer client.Close()
	broken := make(chan struct{})
	go func() {
		_ = client.Wait()
		close(broken)
	}()
	var wg sync.WaitGroup
	for i, ln := range lns {
		fw := &forwarder{ctx: ctx, client: client, vm: name, ln: ln, remote: fwds[i].remote, stderr: c.App.ErrWriter}
		fmt.Fprintf(c.App.ErrWriter, "forwarding %s -> %s:%d (Ctrl-C to stop)\n", ln.Addr(), name, fw.remote)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fw.serve()
		}()
	}
	var ended error
	select {
	case <-ctx.Done():
	case <-broken:
		if ctx.Err() == nil {
			ended = fmt.Errorf("forward %s: the connection to the VM ended (it stopped, or the daemon went away)", name)
		}
	}
	closeAll()
	_ = client.Close()
	wg.Wait()
	return ended
}

// forwarder carries the connections accepted on one local port to a
// port in the VM.
type forwarder struct {
	ctx    context.Context
	client *ssh.Client
	vm     string
	ln     net.Listener
	remote int
	stderr io.Writer
}

// serve accepts until the listener is closed.
func (f *forwarder) serve() {
	var backoff time.Duration
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, most likely: wait, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			fmt.Fprintf(f.stderr, "den forward: accept on %s: %v\n", f.ln.Addr(), err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		go f.carry(conn)
	}
}

// carry connects conn to the VM's port and copies both ways, passing
// half-closes on, until both directions end.
func (f *forwarder) carry(conn net.Conn) {
	defer conn.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(f.remote))
	rc, err := f.client.DialContext(f.ctx, "tcp", addr)
	if err != nil {
		if f.ctx.Err() == nil {
			fmt.Fprintf(f.stderr, "den forward: %s -> %s:%d: %s\n", f.ln.Addr(), f.vm, f.remote, dialProblem(err, f.vm, f.remote))
		}
		return
	}
	defer rc.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(rc, conn)
		closeWrite(rc)
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(conn, rc)
		closeWrite(conn)
	}()
	wg.Wait()
}

// dialProblem says why a connection to port in vm failed.
func dialProblem(err error, vm string, port int) string {
	if strings.Contains(err.Error(), "connection refused") {
		return fmt.Sprintf("nothing listens on port %d in %s", port, vm)
	}
	return err.Error()
}

// closeWrite half-closes c when it can, and closes it otherwise.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
