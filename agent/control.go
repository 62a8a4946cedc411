package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"golang.org/x/crypto/ssh"
)

// Ready asks the agent whether it is up and who it is.
func (c *Client) Ready(ctx context.Context) (ReadyInfo, error) {
	return c.ready(ctx, ReadyRequest{})
}

func (c *Client) ready(ctx context.Context, req ReadyRequest) (ReadyInfo, error) {
	var r ReadyInfo
	err := c.call(ctx, ReqReady, req, &r)
	return r, err
}

// SetClock steps the guest's wall clock to t (after a restore or wake the
// guest clock is stale).
func (c *Client) SetClock(ctx context.Context, t time.Time) (ClockReply, error) {
	var r ClockReply
	err := c.call(ctx, ReqClock, ClockRequest{UnixNano: t.UnixNano()}, &r)
	return r, err
}

// Freeze freezes the guest's filesystems; the agent thaws them by itself
// after timeout (default 30 s), or when this connection ends.
func (c *Client) Freeze(ctx context.Context, timeout time.Duration) (FreezeReply, error) {
	var r FreezeReply
	err := c.call(ctx, ReqFreeze, FreezeRequest{TimeoutMS: timeout.Milliseconds()}, &r)
	return r, err
}

// Thaw thaws what Freeze froze.
func (c *Client) Thaw(ctx context.Context) (ThawReply, error) {
	var r ThawReply
	err := c.call(ctx, ReqThaw, struct{}{}, &r)
	return r, err
}

// NewIdentity is NewIdentityToken without a token: the guest's
// /etc/den/identity is left alone, so its next cold boot makes yet another
// identity.
func (c *Client) NewIdentity(ctx context.Context, hostname string) (IdentityReply, error) {
	return c.NewIdentityToken(ctx, hostname, "")
}

// NewIdentityToken gives a running forked guest a new identity: a kernel
// RNG reseeded with fresh random bytes from the host (first), the hostname
// (empty keeps it), a new machine-id and new SSH host keys (the agent's own
// key, which new connections then see; OpenSSH's are removed or
// regenerated). token is the VM's den.identity (32 lowercase hex digits):
// the guest records it so that a cold boot with the same den.identity on
// its kernel command line keeps this identity.
func (c *Client) NewIdentityToken(ctx context.Context, hostname, token string) (IdentityReply, error) {
	return c.NewIdentityWith(ctx, IdentityRequest{Hostname: hostname, Token: token})
}

// NewIdentityWith is NewIdentityToken with every field of the request
// (a MAC too); its Entropy is filled in here.
func (c *Client) NewIdentityWith(ctx context.Context, req IdentityRequest) (IdentityReply, error) {
	req, err := withEntropy(req)
	if err != nil {
		return IdentityReply{}, err
	}
	var r IdentityReply
	err = c.call(ctx, ReqIdentity, req, &r)
	return r, err
}

// withEntropy fills in req's Entropy with fresh random bytes.
func withEntropy(req IdentityRequest) (IdentityRequest, error) {
	req.Entropy = make([]byte, 64)
	if _, err := rand.Read(req.Entropy); err != nil {
		return req, fmt.Errorf("agent identity: %w", err)
	}
	return req, nil
}

// GrowRoot grows the guest's root filesystem (ext4, online) to the size
// of its block device. minDeviceBytes, when above 0, is the size the host
// just gave the disk: the agent first waits, briefly, for the guest kernel
// to see it. Growing a filesystem that already fills its device changes
// nothing; the agent refuses while filesystems are frozen.
func (c *Client) GrowRoot(ctx context.Context, minDeviceBytes int64) (GrowReply, error) {
	var r GrowReply
	err := c.call(ctx, ReqGrowRoot, GrowRequest{MinDeviceBytes: minDeviceBytes}, &r)
	return r, err
}

// Activity reports the guest's activity for the idle policy.
func (c *Client) Activity(ctx context.Context) (Activity, error) {
	var r Activity
	err := c.call(ctx, ReqActivity, struct{}{}, &r)
	return r, err
}

// ProcLog reads the guest's process record after sequence number after
// (0: from its oldest), at most max events (0: the agent's bound).
func (c *Client) ProcLog(ctx context.Context, after uint64, max int) (ProcLogReply, error) {
	var r ProcLogReply
	err := c.call(ctx, ReqProcLog, ProcLogRequest{After: after, Max: max}, &r)
	return r, err
}

// SetProcRecord switches the guest's process and file record on or off
// (until its next boot) and reads where it stands.
func (c *Client) SetProcRecord(ctx context.Context, on bool) (ProcLogReply, error) {
	req := ProcLogRequest{After: math.MaxUint64, Max: 1, Record: "off"}
	if on {
		req.Record = "on"
	}
	var r ProcLogReply
	err := c.call(ctx, ReqProcLog, req, &r)
	return r, err
}

// Poweroff asks the guest to stop its processes, unmount and power off.
// It returns once the agent has accepted; the VM stops shortly after.
func (c *Client) Poweroff(ctx context.Context) error {
	return c.call(ctx, ReqPoweroff, PoweroffRequest{}, nil)
}

// DialFunc opens a stream on the guest channel (vmm.VMM.DialGuest with the
// agent's port).
type DialFunc func(ctx context.Context) (net.Conn, error)

// WaitReady dials and handshakes until the agent answers Ready, retrying
// with a short backoff, bounded by ctx. It returns the connected client.
func WaitReady(ctx context.Context, dial DialFunc, signer ssh.Signer, opts ...DialOption) (*Client, ReadyInfo, error) {
	backoff := 20 * time.Millisecond
	var last error
	for {
		c, info, err := tryReady(ctx, dial, signer, opts)
		if err == nil {
			return c, info, nil
		}
		last = err
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ReadyInfo{}, fmt.Errorf("agent not ready: %w (last error: %w)", ctx.Err(), last)
		case <-t.C:
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

func tryReady(ctx context.Context, dial DialFunc, signer ssh.Signer, opts []DialOption) (*Client, ReadyInfo, error) {
	conn, err := dial(ctx)
	if err != nil {
		return nil, ReadyInfo{}, fmt.Errorf("dial: %w", err)
	}
	c, err := Dial(ctx, conn, signer, opts...)
	if err != nil {
		return nil, ReadyInfo{}, err
	}
	req, err := readyRequest(opts)
	if err != nil {
		c.Close()
		return nil, ReadyInfo{}, err
	}
	info, err := c.ready(ctx, req)
	if err != nil {
		c.Close()
		if errors.Is(err, ErrUnsupported) {
			return nil, ReadyInfo{}, fmt.Errorf("agent does not answer %s: %w", ReqReady, err)
		}
		return nil, ReadyInfo{}, err
	}
	return c, info, nil
}

// readyRequest is the ready request opts ask for, made as it is sent.
func readyRequest(opts []DialOption) (ReadyRequest, error) {
	var o dialOptions
	for _, f := range opts {
		f(&o)
	}
	var req ReadyRequest
	if o.identity != nil {
		id, err := withEntropy(*o.identity)
		if err != nil {
			return req, err
		}
		req.Identity = &id
	}
	if o.setClock {
		req.ClockUnixNano = time.Now().UnixNano()
	}
	return req, nil
}
