package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
)

// identityRequest is the new identity of a VM restored from another's
// memory (a fork, or a create from a warm base): its own hostname,
// machine-id, host keys and random state; the token is recorded in the
// guest, so that a later cold boot with the same den.identity keeps this
// identity. restoreInto has the agent's ready answer give it.
//
// A VM with a network device gets its own MAC and addresses too: the
// device state and the guest's configuration restored from the source's
// memory hold the source's, so the agent sets the new ones on the guest's
// interface (a cold boot takes them from the VMM's config and the kernel
// command line).
func (ag *agents) identityRequest(vm registry.VM, sp spec) agent.IdentityRequest {
	req := agent.IdentityRequest{Hostname: vm.Name, Token: sp.Identity}
	req.MAC, req.Net = ag.m.net.identity(vm, sp)
	return req
}

// identityAnswered checks the new identity the agent's ready answer
// (info) gave and traces its guest steps; an agent older than the
// identity in the ready request is sent req on its own.
func (ag *agents) identityAnswered(ctx context.Context, in *instance, info agent.ReadyInfo, req agent.IdentityRequest) error {
	reply := info.Identity
	switch {
	case info.IdentityError != "":
		return fmt.Errorf("new identity: %s", info.IdentityError)
	case reply == nil:
		end := phase.Begin(ctx, "new identity")
		c, err := ag.agentClient(ctx, in)
		var r agent.IdentityReply
		if err == nil {
			r, err = c.NewIdentityWith(ctx, req)
		}
		end()
		if err != nil {
			return fmt.Errorf("new identity: %w", err)
		}
		reply = &r
	}
	// The guest's steps ran one after the other and ended before its
	// answer came: each is placed before the next.
	end := time.Now()
	var total, cpu time.Duration
	for _, s := range reply.Steps {
		total += time.Duration(s.MS * float64(time.Millisecond))
		cpu += time.Duration(s.CPUMS * float64(time.Millisecond))
	}
	if info.Identity != nil {
		phase.RecordEnded(ctx, "new identity (in the agent's ready answer)", end, total)
	}
	if cpu > 0 {
		// How much of the guest's time was its agent's own work (under
		// TCG: mostly kernel code run for the first time in a new QEMU).
		phase.RecordEnded(ctx, "new identity: the guest agent's cpu time", end, cpu)
	}
	for i := len(reply.Steps) - 1; i >= 0; i-- {
		d := time.Duration(reply.Steps[i].MS * float64(time.Millisecond))
		phase.RecordEnded(ctx, "guest: "+reply.Steps[i].Name, end, d)
		end = end.Add(-d)
	}
	return nil
}
