package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/registry"
)

// newIdentity gives a VM restored from another's memory (a fork, or a
// create from a warm base) its own hostname, machine-id, host keys and
// random state; the token is recorded in the guest, so that a later cold
// boot with the same den.identity keeps this identity.
//
// A VM with a network device gets its own MAC and addresses too: the
// device state and the guest's configuration restored from the source's
// memory hold the source's, so the agent sets the new ones on the guest's
// interface (a cold boot takes them from the VMM's config and the kernel
// command line).
func (m *Manager) newIdentity(ctx context.Context, in *instance, vm registry.VM, sp spec) error {
	c, err := m.agentClient(ctx, in)
	if err != nil {
		return err
	}
	req := agent.IdentityRequest{Hostname: vm.Name, Token: sp.Identity}
	req.MAC, req.Net = m.identityNet(vm, sp)
	reply, err := c.NewIdentityWith(ctx, req)
	if err != nil {
		return fmt.Errorf("new identity: %w", err)
	}
	// The guest's steps ran one after the other and ended before its
	// answer came: each is placed before the next.
	end := time.Now()
	for i := len(reply.Steps) - 1; i >= 0; i-- {
		d := time.Duration(reply.Steps[i].MS * float64(time.Millisecond))
		phase.RecordEnded(ctx, "guest: "+reply.Steps[i].Name, end, d)
		end = end.Add(-d)
	}
	return nil
}
