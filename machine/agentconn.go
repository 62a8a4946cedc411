package machine

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/agent"
)

// connectAgent dials the guest agent until it answers ready, bounded by
// timeout and ctx, keeps the connection on the instance and returns the
// agent's answer (opts: agent.WithClockSet).
func (ag *agents) connectAgent(ctx context.Context, in *instance, timeout time.Duration, opts ...agent.DialOption) (agent.ReadyInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := func(ctx context.Context) (net.Conn, error) {
		select {
		case <-in.hv.Exited():
			return nil, fmt.Errorf("vmm exited: %v", in.hv.ExitErr())
		default:
		}
		return in.hv.DialGuest(ctx, agent.Port)
	}
	type result struct {
		c    *agent.Client
		info agent.ReadyInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, info, err := agent.WaitReady(ctx, dial, ag.m.signer, opts...)
		done <- result{c, info, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return agent.ReadyInfo{}, fmt.Errorf("guest agent: %w", r.err)
		}
		in.agentMu.Lock()
		if in.agent != nil {
			in.agent.Close()
		}
		in.agent = r.c
		in.agentMu.Unlock()
		if f := ag.m.cfg.OnAgent; f != nil {
			name := in.name
			f(name, r.c, func(e activity.Entry) { ag.m.records.markLazy(name, e) })
		}
		return r.info, nil
	case <-in.hv.Exited():
		cancel()
		<-done
		return agent.ReadyInfo{}, fmt.Errorf("vmm exited before the guest agent answered: %v", in.hv.ExitErr())
	}
}

// agentClient returns the instance's agent connection, redialing it when
// it broke (the agent restarted, a restore reset the channel).
func (ag *agents) agentClient(ctx context.Context, in *instance) (*agent.Client, error) {
	// One redial at a time: a QEMU guest channel takes one connection,
	// and a second dial would wait for the first, then replace it.
	in.dialMu.Lock()
	defer in.dialMu.Unlock()
	in.agentMu.Lock()
	c := in.agent
	in.agentMu.Unlock()
	if c != nil {
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	if _, err := ag.connectAgent(ctx, in, 30*time.Second); err != nil {
		return nil, err
	}
	in.agentMu.Lock()
	defer in.agentMu.Unlock()
	return in.agent, nil
}

// connectedAgent is the instance's agent connection while it is up
// (nil when none is, or it broke): no dial.
func (in *instance) connectedAgent() *agent.Client {
	in.agentMu.Lock()
	c := in.agent
	in.agentMu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c.Done():
		return nil
	default:
		return c
	}
}

// agents are the connections to the guests' agents, and the identity a
// restored guest is given through them (agentconn.go, identity.go).
type agents struct{ m *Manager }
