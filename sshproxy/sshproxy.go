// Package sshproxy relays SSH channels, with their requests and exit
// status, from a client-facing SSH connection to a guest agent's SSH
// connection.
//
// den uses it twice: the CLI's exec and ssh verbs speak SSH to the daemon
// over its unix socket, and the SSH gateway speaks SSH to the world; both
// end in the one agent connection the daemon keeps per VM.
package sshproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"os"
	"time"

	"golang.org/x/crypto/ssh"
)

// Opener opens channels on the upstream (agent) connection; *ssh.Client
// and ssh.Conn satisfy it.
type Opener interface {
	OpenChannel(name string, data []byte) (ssh.Channel, <-chan *ssh.Request, error)
}

// Hooks lets the caller observe proxied channels (all optional).
type Hooks struct {
	// Allow vets a channel before it is opened upstream (e.g. refuse
	// port forwards); a non-nil error rejects it with that message.
	Allow func(channelType string, extra []byte) error
	// Begin is called when a channel is open, End when it closed: the
	// idle policy counts them as activity.
	Begin, End func(channelType string)
	// Logger for failures (nil: slog.Default()).
	Logger *slog.Logger
}

// Serve relays every channel arriving on chans to upstream until chans is
// closed (the client disconnected) or ctx ends. Global requests of the
// client are declined: callers handle their own.
func Serve(ctx context.Context, chans <-chan ssh.NewChannel, upstream Opener, h Hooks) {
	if h.Logger == nil {
		h.Logger = slog.Default()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case nc, ok := <-chans:
			if !ok {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				RelayChannel(nc, upstream, h)
			}()
		}
	}
}

// RelayChannel opens nc's twin upstream, accepts nc, and relays between
// them until both are closed; a refusal upstream is passed back to nc.
func RelayChannel(nc ssh.NewChannel, upstream Opener, h Hooks) {
	typ := nc.ChannelType()
	if h.Logger == nil {
		h.Logger = slog.Default()
	}
	if h.Allow != nil {
		if err := h.Allow(typ, nc.ExtraData()); err != nil {
			_ = nc.Reject(ssh.Prohibited, err.Error())
			return
		}
	}
	up, upReqs, err := upstream.OpenChannel(typ, nc.ExtraData())
	if err != nil {
		var oce *ssh.OpenChannelError
		if errors.As(err, &oce) {
			_ = nc.Reject(oce.Reason, oce.Message)
		} else {
			_ = nc.Reject(ssh.ConnectionFailed, fmt.Sprintf("vm unreachable: %v", err))
		}
		return
	}
	down, downReqs, err := nc.Accept()
	if err != nil {
		up.Close()
		return
	}
	if h.Begin != nil {
		h.Begin(typ)
	}
	if h.End != nil {
		defer h.End(typ)
	}
	Relay(down, downReqs, up, upReqs)
}

// Relay copies data and requests between two open channels in both
// directions and closes both when done. The downstream side is closed
// only after every upstream request (exit-status above all) has been
// passed on, and after every downstream request already sent upstream
// has its reply passed back: a command that ends at once (exit 7) closes
// the upstream channel right after answering the exec request, and the
// client must see that answer, then the exit status, before the close.
func Relay(down ssh.Channel, downReqs <-chan *ssh.Request, up ssh.Channel, upReqs <-chan *ssh.Request) {
	var upDone sync.WaitGroup // what must finish before down is closed
	var inFlight sync.Mutex   // held while a downstream request is forwarded
	upDone.Add(2)
	go func() { // upstream requests -> downstream (exit-status, eow...)
		defer upDone.Done()
		forwardRequests(upReqs, down, nil)
	}()
	go func() { // upstream stdout and stderr -> downstream, then EOF
		defer upDone.Done()
		var outs sync.WaitGroup
		outs.Add(1)
		go func() {
			defer outs.Done()
			_, _ = io.Copy(down.Stderr(), up.Stderr())
		}()
		_, _ = io.Copy(down, up)
		// Not before stderr is through: nothing is sent after an EOF.
		outs.Wait()
		_ = down.CloseWrite()
		if os.Getenv("RELAYDEBUG") != "" {
			fmt.Fprintf(os.Stderr, "%s down EOF sent\n", time.Now().Format("05.000000"))
		}
	}()
	go func() { // downstream requests -> upstream (pty-req, exec, window-change...)
		forwardRequests(downReqs, up, &inFlight)
		if os.Getenv("RELAYDEBUG") != "" {
			fmt.Fprintf(os.Stderr, "%s downReqs closed\n", time.Now().Format("05.000000"))
		}
		// The client closed its side of the channel.
		_ = up.Close()
	}()
	go func() { // downstream stdin -> upstream
		_, _ = io.Copy(up, down)
		_ = up.CloseWrite()
		if os.Getenv("RELAYDEBUG") != "" {
			fmt.Fprintf(os.Stderr, "%s up EOF sent\n", time.Now().Format("05.000000"))
		}
	}()
	upDone.Wait()
	// A downstream request sent upstream before the upstream closed got
	// its answer before the close (a channel's messages are in order):
	// pass it back before closing.
	inFlight.Lock()
	_ = down.Close()
	inFlight.Unlock()
	_ = up.Close()
}

// forwardRequests passes each request on to dst, with dst's reply;
// inFlight, when set, is held from a request's arrival until its reply
// is passed back.
func forwardRequests(reqs <-chan *ssh.Request, dst ssh.Channel, inFlight *sync.Mutex) {
	for req := range reqs {
		if inFlight != nil {
			inFlight.Lock()
		}
		ok, err := dst.SendRequest(req.Type, req.WantReply, req.Payload)
		if os.Getenv("RELAYDEBUG") != "" {
			fmt.Fprintf(os.Stderr, "%s fwd %s want=%v -> ok=%v err=%v\n", time.Now().Format("05.000000"), req.Type, req.WantReply, ok, err)
		}
		if err != nil {
			ok = false
		}
		if req.WantReply {
			_ = req.Reply(ok, nil)
		}
		if inFlight != nil {
			inFlight.Unlock()
		}
	}
}
