//go:build linux

package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/denhq/den/agent"
	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// poweroffDelay lets the poweroff reply reach the host before the agent
// starts closing connections.
const poweroffDelay = 200 * time.Millisecond

// Clock bounds: a time outside them is a bug on the host, not a clock.
var (
	minClock = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	maxClock = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

type controlFunc func(ctx ssh.Context, payload []byte) (any, error)

// requestHandlers maps the control requests to their handlers. A failure
// replies SSH_MSG_REQUEST_FAILURE with the error text as payload.
func (s *Server) requestHandlers() map[string]ssh.RequestHandler {
	wrap := func(name string, fn controlFunc) ssh.RequestHandler {
		return func(ctx ssh.Context, _ *ssh.Server, req *gossh.Request) (bool, []byte) {
			res, err := fn(ctx, req.Payload)
			if err == nil {
				var data []byte
				if data, err = json.Marshal(res); err == nil {
					return true, data
				}
			}
			s.log.Warn("control request failed", "request", name, "err", err)
			msg := err.Error()
			if msg == "" {
				msg = "failed"
			}
			return false, []byte(msg)
		}
	}
	return map[string]ssh.RequestHandler{
		agent.ReqReady:    wrap(agent.ReqReady, s.ctlReady),
		agent.ReqClock:    wrap(agent.ReqClock, s.ctlClock),
		agent.ReqFreeze:   wrap(agent.ReqFreeze, s.ctlFreeze),
		agent.ReqThaw:     wrap(agent.ReqThaw, s.ctlThaw),
		agent.ReqIdentity: wrap(agent.ReqIdentity, s.ctlIdentity),
		agent.ReqActivity: wrap(agent.ReqActivity, s.ctlActivity),
		agent.ReqPoweroff: wrap(agent.ReqPoweroff, s.ctlPoweroff),
		agent.ReqGrowRoot: wrap(agent.ReqGrowRoot, s.ctlGrowRoot),
		agent.ReqProcLog:  wrap(agent.ReqProcLog, s.ctlProcLog),
		agent.ReqKeyAgent: wrap(agent.ReqKeyAgent, s.ctlKeyAgent),
		agent.ReqSecrets:  wrap(agent.ReqSecrets, s.ctlSecrets),
		"keepalive@openssh.com": func(ssh.Context, *ssh.Server, *gossh.Request) (bool, []byte) {
			return true, nil
		},
	}
}

func decode(name string, payload []byte, v any) error {
	if len(payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("%s: bad payload: %w", name, err)
	}
	return nil
}

func (s *Server) ctlReady(_ ssh.Context, payload []byte) (any, error) {
	var req agent.ReadyRequest
	if len(payload) > 0 {
		if err := decode("ready", payload, &req); err != nil {
			return nil, err
		}
	}
	var clock *agent.ClockReply
	clockErr := ""
	if req.ClockUnixNano != 0 {
		r, err := s.setClock(req.ClockUnixNano)
		if err != nil {
			clockErr = err.Error()
		} else {
			clock = &r
		}
	}
	var identity *agent.IdentityReply
	identityErr := ""
	if req.Identity != nil {
		if clockErr != "" {
			identityErr = "the clock was not set: " + clockErr
		} else if r, err := s.newIdentity(*req.Identity); err != nil {
			identityErr = err.Error()
		} else {
			identity = &r
		}
	}
	bootID, _ := os.ReadFile(s.sys.ProcDir + "/sys/kernel/random/boot_id")
	return agent.ReadyInfo{
		Version:       agent.Version,
		BootID:        strings.TrimSpace(string(bootID)),
		Uptime:        uptime(),
		Time:          time.Now(),
		Hostname:      hostname(),
		PID1:          s.sys.PID1,
		Frozen:        s.freeze.isFrozen(),
		Clock:         clock,
		ClockError:    clockErr,
		Identity:      identity,
		IdentityError: identityErr,
	}, nil
}

func (s *Server) ctlClock(_ ssh.Context, payload []byte) (any, error) {
	var req agent.ClockRequest
	if err := decode("clock", payload, &req); err != nil {
		return nil, err
	}
	return s.setClock(req.UnixNano)
}

// setClock steps the guest's wall clock to unixNano (ReqClock, or a
// ReqReady that carries the host's time).
func (s *Server) setClock(unixNano int64) (agent.ClockReply, error) {
	t := time.Unix(0, unixNano)
	if t.Before(minClock) || t.After(maxClock) {
		return agent.ClockReply{}, fmt.Errorf("clock: refusing to set the clock to %s", t.UTC().Format(time.RFC3339Nano))
	}
	prev := time.Now()
	if err := s.sys.SetClock(t); err != nil {
		return agent.ClockReply{}, fmt.Errorf("clock: %w", err)
	}
	step := t.Sub(prev)
	if step > time.Second || step < -time.Second {
		s.log.Info("clock set", "step", step.String())
	}
	return agent.ClockReply{Previous: prev, Step: step}, nil
}

func (s *Server) ctlFreeze(ctx ssh.Context, payload []byte) (any, error) {
	var req agent.FreezeRequest
	if err := decode("freeze", payload, &req); err != nil {
		return nil, err
	}
	return s.freeze.freeze(ctx.Done(), time.Duration(req.TimeoutMS)*time.Millisecond)
}

func (s *Server) ctlThaw(ssh.Context, []byte) (any, error) {
	return s.freeze.thaw()
}

func (s *Server) ctlIdentity(_ ssh.Context, payload []byte) (any, error) {
	var req agent.IdentityRequest
	if err := decode("identity", payload, &req); err != nil {
		return nil, err
	}
	return s.newIdentity(req)
}

func (s *Server) ctlActivity(ssh.Context, []byte) (any, error) {
	return s.activity()
}

func (s *Server) ctlProcLog(_ ssh.Context, payload []byte) (any, error) {
	var req agent.ProcLogRequest
	if err := decode("proclog", payload, &req); err != nil {
		return nil, err
	}
	rec := s.cfg.ProcRecord
	if rec == nil {
		reason := s.cfg.ProcRecordOff
		if reason == "" {
			reason = "the agent was started without a process record"
		}
		return agent.ProcLogReply{Off: true, Reason: reason, Events: []agent.ProcEvent{}}, nil
	}
	switch req.Record {
	case "":
	case "on", "off":
		if err := rec.SetRecording(req.Record == "on"); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("proclog: record %q is neither on nor off", req.Record)
	}
	rec.Drain() // what happened before this request is in the reply
	return rec.Read(req.After, req.Max), nil
}

func (s *Server) ctlPoweroff(_ ssh.Context, payload []byte) (any, error) {
	var req agent.PoweroffRequest
	if err := decode("poweroff", payload, &req); err != nil {
		return nil, err
	}
	if s.sys.Poweroff == nil {
		return nil, errors.New("poweroff: not available")
	}
	s.log.Info("poweroff requested by the host", "reboot", req.Reboot)
	go func() {
		time.Sleep(poweroffDelay)
		s.sys.Poweroff(req.Reboot)
	}()
	return struct{}{}, nil
}
