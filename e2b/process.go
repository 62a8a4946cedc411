package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/denhq/den/agent"
)

// A process started through envd's process service runs in an SSH exec
// session of its own over a guest agent connection of its own, held by
// the daemon (not by the request), so that it outlives the stream that
// started it and other calls can reach it: connect, input, signals.
// Its pid is the guest's: the command line prints the shell's pid on
// stderr (a marker line den removes) and then execs the command.

// processService is envd's process service (process.Process): its
// Connect handlers, over the server's processes.
type processService struct{ s *Server }

// pidMarker starts the line that carries the guest pid.
const pidMarker = "\x1eden-pid "

// proc is one process started through the process service.
type proc struct {
	sandbox string
	cfg     processConfig
	tag     *string
	pty     bool
	g       *agent.Client
	stdin   *io.PipeWriter // nil: no input
	writing chan struct{}  // holds one writer of stdin at a time
	resize  chan agent.WindowSize

	started chan struct{} // closed once pid is known (or the start failed)
	pid     uint32

	mu    sync.Mutex
	subs  map[*sub]struct{}
	ended bool
	// detached: its agent connection ended before it did (the sandbox
	// was paused or slept): it runs on in the guest (the agent keeps it),
	// unfollowed; it is listed until it is found gone, and can be killed.
	detached bool
	// gone: its sandbox was killed (forget): it is neither detached nor
	// logged when its connection ends.
	gone bool
}

// isDetached reads detached.
func (p *proc) isDetached() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.detached
}

// errDetached is what calls that need a followed process answer for a
// detached one.
func errDetached(pid uint32) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("den: process %d runs on from before the sandbox was paused, but den no longer follows its output or input (commands.kill ends it)", pid))
}

// sub is one stream following a process's events.
type sub struct {
	ch   chan *processEvent
	gone chan struct{}
}

// processes are the processes of every sandbox.
type processes struct {
	mu    sync.Mutex
	procs map[string]map[uint32]*proc
}

func newProcesses() *processes { return &processes{procs: map[string]map[uint32]*proc{}} }

func (ps *processes) add(p *proc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.procs[p.sandbox] == nil {
		ps.procs[p.sandbox] = map[uint32]*proc{}
	}
	ps.procs[p.sandbox][p.pid] = p
}

func (ps *processes) remove(p *proc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.procs[p.sandbox][p.pid] == p {
		delete(ps.procs[p.sandbox], p.pid)
	}
}

func (ps *processes) list(sandbox string) []*proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return slices.Collect(maps.Values(ps.procs[sandbox]))
}

// find is the process sel selects in sandbox.
func (ps *processes) find(sandbox string, sel *selector) (*proc, error) {
	if sel == nil || sel.PID == nil && sel.Tag == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("den: select a process by pid or tag"))
	}
	for _, p := range ps.list(sandbox) {
		if sel.PID != nil && p.pid == *sel.PID || sel.PID == nil && p.tag != nil && *p.tag == *sel.Tag {
			return p, nil
		}
	}
	what := "tag " + strconv.Quote(ptrOr(sel.Tag))
	if sel.PID != nil {
		what = fmt.Sprintf("pid %d", *sel.PID)
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("den: no process with %s started through the E2B API in sandbox %s", what, sandbox))
}

// forget closes the agent connections of sandbox's processes (it was
// killed or paused: they are gone with it).
func (ps *processes) forget(sandbox string) {
	ps.mu.Lock()
	procs := ps.procs[sandbox]
	delete(ps.procs, sandbox)
	ps.mu.Unlock()
	for _, p := range procs {
		p.mu.Lock()
		p.gone = true
		p.mu.Unlock()
		p.g.Close()
	}
}

// detach closes the agent connections of sandbox's processes (it is
// paused): each becomes detached, running on in the guest.
func (ps *processes) detach(sandbox string) {
	for _, p := range ps.list(sandbox) {
		p.g.Close()
	}
}

func ptrOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// subscribe adds a follower of p's events; nil when p has ended.
func (p *proc) subscribe() *sub {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil
	}
	s := &sub{ch: make(chan *processEvent, 16), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *sub) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[s]; ok {
		delete(p.subs, s)
		close(s.gone)
	}
}

// emit gives ev to every follower, waiting for each (flow control
// reaches the guest) unless it leaves.
func (p *proc) emit(ev *processEvent) {
	p.mu.Lock()
	subs := slices.Collect(maps.Keys(p.subs))
	if ev.End != nil {
		p.ended = true
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// output is a stream of a process: its bytes become data events. The
// pid marker line, first on sniffing stream, is taken out.
type output struct {
	p      *proc
	kind   string // stdout, stderr, pty
	sniff  bool
	buf    []byte
	onPID  func(uint32)
	closed bool
}

func (o *output) Write(b []byte) (int, error) {
	n := len(b)
	if o.sniff {
		o.buf = append(o.buf, b...)
		i := bytes.IndexByte(o.buf, '\n')
		if i < 0 {
			if len(o.buf) > 64 {
				o.sniff = false
				o.onPID(0)
				b, o.buf = o.buf, nil
			} else {
				return n, nil
			}
		} else {
			line := strings.TrimRight(string(o.buf[:i]), "\r")
			rest := o.buf[i+1:]
			o.buf, o.sniff = nil, false
			if v, ok := strings.CutPrefix(line, pidMarker); ok {
				pid, _ := strconv.ParseUint(v, 10, 32)
				o.onPID(uint32(pid))
				b = rest
			} else {
				o.onPID(0)
				b = append([]byte(line+"\n"), rest...)
			}
		}
	}
	<-o.p.started
	if len(b) == 0 {
		return n, nil
	}
	data := bytes.Clone(b)
	ev := &dataEvent{}
	switch o.kind {
	case "stdout":
		ev.Stdout = data
	case "stderr":
		ev.Stderr = data
	default:
		ev.PTY = data
	}
	o.p.emit(&processEvent{Data: ev})
	return n, nil
}

func (svc processService) routes(opts []connect.HandlerOption) {
	svc.s.envd.Handle("/process.Process/Start", connect.NewServerStreamHandler("/process.Process/Start", svc.startProcess, opts...))
	svc.s.envd.Handle("/process.Process/Connect", connect.NewServerStreamHandler("/process.Process/Connect", svc.connectProcess, opts...))
	svc.s.envd.Handle("/process.Process/List", connect.NewUnaryHandler("/process.Process/List", svc.listProcesses, opts...))
	svc.s.envd.Handle("/process.Process/SendInput", connect.NewUnaryHandler("/process.Process/SendInput", svc.sendInput, opts...))
	svc.s.envd.Handle("/process.Process/StreamInput", connect.NewClientStreamHandler("/process.Process/StreamInput", svc.streamInput, opts...))
	svc.s.envd.Handle("/process.Process/SendSignal", connect.NewUnaryHandler("/process.Process/SendSignal", svc.sendSignal, opts...))
	svc.s.envd.Handle("/process.Process/CloseStdin", connect.NewUnaryHandler("/process.Process/CloseStdin", svc.closeStdin, opts...))
	svc.s.envd.Handle("/process.Process/Update", connect.NewUnaryHandler("/process.Process/Update", svc.update, opts...))
}

// keepaliveEvery is the interval of keepalive events the client asks
// for (Keepalive-Ping-Interval, seconds); 0: none.
func keepaliveEvery(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

func (svc processService) startProcess(ctx context.Context, req *connect.Request[startRequest], stream *connect.ServerStream[eventResponse]) error {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return err
	}
	defer c.api.CloseIdle()
	in := req.Msg
	if in.Process == nil || in.Process.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("den: process.cmd is required"))
	}
	env := []string{}
	rec, _ := svc.s.recs.get(id)
	merged := maps.Clone(rec.EnvVars)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, in.Process.Envs)
	for _, k := range slices.Sorted(maps.Keys(merged)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: bad environment variable name %q", k))
		}
		env = append(env, k+"="+merged[k])
	}
	user, _ := userOf(req.Header())
	run := "exec "
	if user != "" && user != "root" {
		run = asUser(user, ptrOr(in.Process.Cwd) == "")
	}
	line := fmt.Sprintf("printf '%s%%d\\n' $$ >&2; %s%s", pidMarker, run, agent.QuoteCommand(append([]string{in.Process.Cmd}, in.Process.Args...)))
	g, err := guest(ctx, c, id)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	p := &proc{sandbox: id, cfg: *in.Process, tag: in.Tag, pty: in.PTY != nil, g: g, started: make(chan struct{}), subs: map[*sub]struct{}{},
		writing: make(chan struct{}, 1)}
	who := user
	if who == "" {
		who = "root"
	}
	cmdline := strings.Join(append([]string{in.Process.Cmd}, in.Process.Args...), " ")
	if len(cmdline) > 200 {
		cmdline = cmdline[:200] + "..."
	}
	var once sync.Once
	// A process is listed from the moment its pid is known, before any
	// of its output and so before its end (which unlists it).
	onPID := func(pid uint32) {
		once.Do(func() {
			p.pid = pid
			if pid != 0 {
				svc.s.procs.add(p)
				svc.s.logs.add(id, "info", fmt.Sprintf("process %d started as %s: %s", pid, who, cmdline), "pid", strconv.FormatUint(uint64(pid), 10), "user", who)
			}
			close(p.started)
		})
	}
	// Keep: the process outlives its agent connection, as an envd
	// process outlives a pause.
	ereq := agent.ExecRequest{CmdLine: line, Env: env, Dir: ptrOr(in.Process.Cwd), Keep: true}
	if ereq.Dir != "" && !path.IsAbs(ereq.Dir) {
		// Relative to the user's home, which the guest resolves.
		ereq.Dir = ""
		rel := strings.TrimPrefix(strings.TrimPrefix(ptrOr(in.Process.Cwd), "~"), "/")
		ereq.CmdLine = "cd ~" + user + "/" + agent.QuoteCommand([]string{rel}) + " || exit 1; " + line
	} else if ereq.Dir != "" {
		ereq.Dir = path.Clean(ereq.Dir)
	}
	if in.PTY != nil {
		ereq.TTY = true
		if in.PTY.Size != nil {
			ereq.Rows, ereq.Cols = int(in.PTY.Size.Rows), int(in.PTY.Size.Cols)
		}
		p.resize = make(chan agent.WindowSize, 1)
		ereq.Resize = p.resize
		ereq.Stdout = &output{p: p, kind: "pty", sniff: true, onPID: onPID}
	} else {
		ereq.Stdout = &output{p: p, kind: "stdout", onPID: onPID}
		ereq.Stderr = &output{p: p, kind: "stderr", sniff: true, onPID: onPID}
	}
	if in.PTY != nil || in.Stdin == nil || *in.Stdin {
		pr, pw := io.Pipe()
		ereq.Stdin, p.stdin = pr, pw
	}
	follow := p.subscribe()
	started := time.Now()
	go func() {
		status, err := g.Exec(context.Background(), ereq)
		onPID(0)
		end := &endEvent{ExitCode: int32(status), Exited: err == nil, Status: fmt.Sprintf("exit status %d", status)}
		level := "info"
		p.mu.Lock()
		gone := p.gone
		p.mu.Unlock()
		if err != nil && p.pid != 0 && gone {
			msg := "den: the sandbox was killed"
			end.Error, end.Status, end.Exited = &msg, "killed", false
			p.emit(&processEvent{End: end})
			g.Close()
			return
		}
		if err != nil && p.pid != 0 {
			// The connection ended before the process: it runs on.
			msg := "den: the sandbox's connection ended (it was paused or slept): the process runs on, its output no longer followed"
			end.Error, end.Status, end.Exited = &msg, "detached", false
			p.mu.Lock()
			p.detached = true
			p.mu.Unlock()
			if p.stdin != nil {
				p.stdin.Close()
			}
			p.emit(&processEvent{End: end})
			svc.s.logs.add(id, "info", fmt.Sprintf("process %d detached: the sandbox's connection ended; it runs on", p.pid), "pid", strconv.FormatUint(uint64(p.pid), 10))
			g.Close()
			return
		}
		if err != nil {
			msg := err.Error()
			end.Error, end.Status, level = &msg, "error", "error"
		}
		svc.s.logs.add(id, level, fmt.Sprintf("process %d ended: %s after %s", p.pid, end.Status, time.Since(started).Round(time.Millisecond)),
			"pid", strconv.FormatUint(uint64(p.pid), 10))
		if p.stdin != nil {
			p.stdin.Close()
		}
		p.emit(&processEvent{End: end})
		svc.s.procs.remove(p)
		g.Close()
	}()
	select {
	case <-p.started:
	case <-ctx.Done():
		p.unsubscribe(follow)
		return ctx.Err()
	}
	// With pid 0 the command never ran: its end (and why) follows.
	return svc.follow(ctx, req.Header(), stream, p, follow)
}

// follow streams p's events to a client: its start (pid) first, then
// output until it ends or the client leaves (the process goes on).
func (svc processService) follow(ctx context.Context, h http.Header, stream *connect.ServerStream[eventResponse], p *proc, f *sub) error {
	defer p.unsubscribe(f)
	if err := stream.Send(&eventResponse{Event: &processEvent{Start: &startEvent{PID: p.pid}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if d := keepaliveEvery(h); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev := <-f.ch:
			if err := stream.Send(&eventResponse{Event: ev}); err != nil {
				return err
			}
			if ev.End != nil {
				return nil
			}
		case <-tick:
			if err := stream.Send(&eventResponse{Event: &processEvent{Keepalive: &struct{}{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (svc processService) connectProcess(ctx context.Context, req *connect.Request[selectRequest], stream *connect.ServerStream[eventResponse]) error {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return err
	}
	c.api.CloseIdle()
	p, err := svc.s.procs.find(id, req.Msg.Process)
	if err != nil {
		return err
	}
	if p.isDetached() {
		return errDetached(p.pid)
	}
	f := p.subscribe()
	if f == nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("den: process %d has ended", p.pid))
	}
	return svc.follow(ctx, req.Header(), stream, p, f)
}

func (svc processService) listProcesses(ctx context.Context, req *connect.Request[empty]) (*connect.Response[listResponse], error) {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	defer c.api.CloseIdle()
	if err := svc.pruneDetached(ctx, c, id); err != nil {
		return nil, err
	}
	out := &listResponse{Processes: []processInfo{}}
	for _, p := range svc.s.procs.list(id) {
		cfg := p.cfg
		out.Processes = append(out.Processes, processInfo{Config: &cfg, PID: p.pid, Tag: p.tag})
	}
	slices.SortFunc(out.Processes, func(a, b processInfo) int { return int(a.PID) - int(b.PID) })
	return connect.NewResponse(out), nil
}

// selected authenticates a call about one process and finds it.
func (svc processService) selected(ctx context.Context, h http.Header, sel *selector) (*proc, error) {
	c, id, err := svc.s.envdCaller(ctx, h)
	if err != nil {
		return nil, err
	}
	c.api.CloseIdle()
	return svc.s.procs.find(id, sel)
}

// write gives a process input, waiting for it to be taken until ctx
// ends (a process that does not read its stdin takes none).
func (p *proc) write(ctx context.Context, in *processInput) error {
	if in == nil {
		return nil
	}
	if p.isDetached() {
		return errDetached(p.pid)
	}
	if p.stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("den: process %d was started without stdin", p.pid))
	}
	data := in.Stdin
	if in.PTY != nil {
		data = in.PTY
	}
	unread := func() error {
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("den: process %d does not read its stdin", p.pid))
	}
	select {
	case p.writing <- struct{}{}:
	case <-ctx.Done():
		return unread()
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-p.writing }()
		_, err := p.stdin.Write(data)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("den: process %d: stdin: %w", p.pid, err))
		}
		return nil
	case <-ctx.Done():
		return unread() // the write goes on, and ends with the process
	}
}

func (svc processService) sendInput(ctx context.Context, req *connect.Request[sendInputRequest]) (*connect.Response[empty], error) {
	p, err := svc.selected(ctx, req.Header(), req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if err := p.write(ctx, req.Msg.Input); err != nil {
		return nil, err
	}
	return connect.NewResponse(&empty{}), nil
}

func (svc processService) streamInput(ctx context.Context, stream *connect.ClientStream[streamInputRequest]) (*connect.Response[empty], error) {
	var p *proc
	for stream.Receive() {
		m := stream.Msg()
		switch {
		case m.Start != nil:
			var err error
			if p, err = svc.selected(ctx, stream.RequestHeader(), m.Start.Process); err != nil {
				return nil, err
			}
		case m.Data != nil:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("den: the input stream must start with a start event"))
			}
			if err := p.write(ctx, m.Data.Input); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&empty{}), nil
}

func (svc processService) closeStdin(ctx context.Context, req *connect.Request[selectRequest]) (*connect.Response[empty], error) {
	p, err := svc.selected(ctx, req.Header(), req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("den: process %d was started without stdin", p.pid))
	}
	p.stdin.Close()
	return connect.NewResponse(&empty{}), nil
}

func (svc processService) update(ctx context.Context, req *connect.Request[updateRequest]) (*connect.Response[empty], error) {
	p, err := svc.selected(ctx, req.Header(), req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.PTY; pty != nil && pty.Size != nil {
		if p.resize == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("den: process %d has no terminal", p.pid))
		}
		ws := agent.WindowSize{Rows: int(pty.Size.Rows), Cols: int(pty.Size.Cols)}
		select {
		case p.resize <- ws:
		default:
			select {
			case <-p.resize:
			default:
			}
			p.resize <- ws
		}
	}
	return connect.NewResponse(&empty{}), nil
}

func (svc processService) sendSignal(ctx context.Context, req *connect.Request[sendSignalRequest]) (*connect.Response[empty], error) {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	defer c.api.CloseIdle()
	p, err := svc.s.procs.find(id, req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if p.isDetached() {
		// Alive still? (Its pid may be another's by now.)
		if err := svc.pruneDetached(ctx, c, id); err != nil {
			return nil, err
		}
		if p, err = svc.s.procs.find(id, req.Msg.Process); err != nil {
			return nil, err
		}
	}
	sig := req.Msg.Signal.Number
	if req.Msg.Signal.Name != "" {
		sig = signals[req.Msg.Signal.Name]
	}
	if sig != 9 && sig != 15 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: signal %v: SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.Signal))
	}
	// On a connection of its own: the process's connection closes when
	// the process ends, which this signal may make happen at once. The
	// process leads its own process group (the agent's session): the
	// signal goes to the group, as the agent's own signals do.
	g, err := guest(ctx, c, id)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	defer g.Close()
	line := fmt.Sprintf("kill -%d -- -%d 2>/dev/null || kill -%d %d", sig, p.pid, sig, p.pid)
	var stderr bytes.Buffer
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	status, err := g.Exec(sctx, agent.ExecRequest{CmdLine: line, Stderr: &stderr})
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("den: signal %d: %w", p.pid, err))
	}
	if p.isDetached() {
		// No end event comes for it: it leaves the list now.
		svc.s.procs.remove(p)
	}
	if status != 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("den: signal %d: %s", p.pid, strings.TrimSpace(stderr.String())))
	}
	return connect.NewResponse(&empty{}), nil
}

// pruneDetached drops from sandbox id's list the detached processes
// that are no longer alive in the guest (one look for all of them).
func (svc processService) pruneDetached(ctx context.Context, c *caller, id string) error {
	var pids []string
	detached := map[string]*proc{}
	for _, p := range svc.s.procs.list(id) {
		if p.isDetached() {
			pid := strconv.FormatUint(uint64(p.pid), 10)
			pids = append(pids, pid)
			detached[pid] = p
		}
	}
	if len(pids) == 0 {
		return nil
	}
	g, err := guest(ctx, c, id)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	defer g.Close()
	var out bytes.Buffer
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	line := "for p in " + strings.Join(pids, " ") + "; do kill -0 $p 2>/dev/null && echo $p; done; true"
	if _, err := g.Exec(lctx, agent.ExecRequest{CmdLine: line, Stdout: &out}); err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("den: listing processes: %w", err))
	}
	alive := map[string]bool{}
	for _, pid := range strings.Fields(out.String()) {
		alive[pid] = true
	}
	for pid, p := range detached {
		if !alive[pid] {
			svc.s.procs.remove(p)
		}
	}
	return nil
}
