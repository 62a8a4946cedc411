// Package sshrelay relays SSH channels, with their requests and exit
// status, from a client-facing SSH connection to a guest agent's SSH
// connection.
//
// den uses it twice: the CLI's exec and ssh verbs speak SSH to the daemon
// over its unix socket, and the SSH gateway speaks SSH to the world; both
// end in the one agent connection the daemon keeps per VM.
package sshrelay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

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
	relay(down, downReqs, up, upReqs, typ == "session")
}

// testHookEOFHeld, when set, is called when the relay holds back the
// upstream's EOF until the exit status has been passed on.
var testHookEOFHeld func()

// relay copies data and requests between two open channels in
// both directions and closes both when done (RelayChannel relays any
// channel type).
//
// What the client sees of the upstream's end is ordered so that no
// client can miss the exit status, whatever the order of its own EOF,
// its exec request and the command's exit:
//
//   - a reply to a client's request (exec) is passed back before any
//     upstream request that came after it (exit-status);
//   - the upstream's EOF is passed on only after its exit-status or
//     exit-signal (or once the upstream has no more requests): a client
//     that has sent its own EOF (stdin at EOF) closes the channel as soon
//     as it gets ours, as OpenSSH does, and x/crypto/ssh answers a
//     client's close at once, after which nothing more can be sent on
//     the channel: an exit status still on its way would be lost (the
//     guest agent, like sshd, sends its EOF before the exit status);
//   - the channel is closed only after every upstream request has been
//     passed on and every client request sent upstream has its reply.
//
// session says whether the upstream's EOF waits for its exit status
// (only a session has one: a forward's half-close is passed on at once).
func relay(down ssh.Channel, downReqs <-chan *ssh.Request, up ssh.Channel, upReqs <-chan *ssh.Request, session bool) {
	var upDone sync.WaitGroup // what must finish before down is closed
	var inFlight sync.Mutex   // held while a downstream request is forwarded
	// statusSent is closed once the exit status is passed on, or when
	// the upstream sends no more requests.
	statusSent := make(chan struct{})
	upDone.Add(2)
	go func() { // upstream requests -> downstream (exit-status, eow...)
		defer upDone.Done()
		sent := false
		defer func() {
			if !sent {
				close(statusSent)
			}
		}()
		for req := range upReqs {
			// The reply to a client's request that the upstream sent
			// before this request is passed back first (a barrier: wait
			// for the request in flight, if any).
			inFlight.Lock()
			inFlight.Unlock()
			forward(req, down)
			if !sent && (req.Type == "exit-status" || req.Type == "exit-signal") {
				sent = true
				close(statusSent)
			}
		}
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
		if session {
			select {
			case <-statusSent:
			default:
				if testHookEOFHeld != nil {
					testHookEOFHeld()
				}
				<-statusSent
			}
		}
		_ = down.CloseWrite()
	}()
	go func() { // downstream requests -> upstream (pty-req, exec, window-change...)
		for req := range downReqs {
			inFlight.Lock()
			forward(req, up)
			inFlight.Unlock()
		}
		// The client closed its side of the channel.
		_ = up.Close()
	}()
	go func() { // downstream stdin -> upstream
		_, _ = io.Copy(up, down)
		_ = up.CloseWrite()
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

// forward passes req on to dst, and dst's reply back.
func forward(req *ssh.Request, dst ssh.Channel) {
	ok, err := dst.SendRequest(req.Type, req.WantReply, req.Payload)
	if err != nil {
		ok = false
	}
	if req.WantReply {
		_ = req.Reply(ok, nil)
	}
}
