package machine

import (
	"context"
	"fmt"
)

// newIdentity gives a VM restored from another's memory (a fork, or a
// create from a warm base) its own hostname, machine-id, host keys and
// random state; the token is recorded in the guest, so that a later cold
// boot with the same den.identity keeps this identity.
func (m *Manager) newIdentity(ctx context.Context, in *instance, hostname, token string) error {
	c, err := m.agentClient(ctx, in)
	if err != nil {
		return err
	}
	if _, err := c.NewIdentityToken(ctx, hostname, token); err != nil {
		return fmt.Errorf("new identity: %w", err)
	}
	return nil
}
