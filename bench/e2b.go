package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/api"
)

// The E2B figures (den bench --e2b): the same operations through the
// official e2b SDK (e2e/e2bsdk/bench.mjs against the daemon's
// --e2b-listen) and through den's API client, as the den CLI makes them,
// taken in turn run after run, which goes first alternating.

// e2bForks are the fork counts timed.
var e2bForks = []int{4, 16}

// e2bCommand is the command line the CLI path runs: the one the SDK's
// commands.run('echo ready') has the guest run (a bash login shell), so
// that both paths time the same work in the guest.
const e2bCommand = "/bin/bash -l -c 'echo ready'"

// e2bRunTimeout bounds one run of one side (create, pause, wake, every
// fork and the removals).
const e2bRunTimeout = 15 * time.Minute

// Figure names of the E2B mode; each is taken on both paths.
const (
	e2bCreate  = "create to first command output (time to interactive)"
	e2bCreated = "create until it answers (running)"
	e2bPause   = "pause (den sleep)"
	e2bConnect = "connect to a paused sandbox to first command output (wake)"
)

func e2bForkTotal(n int) string { return fmt.Sprintf("fork x%d, total", n) }
func e2bForkEach(n int) string  { return fmt.Sprintf("fork x%d, per fork", n) }

// e2bSide is a path the figures are taken through: its name in the vmm
// column (after the VMM's) and what each figure times on it.
type e2bSide struct {
	suffix string
	notes  map[string]string
}

var (
	sdkSide = e2bSide{", e2b sdk", map[string]string{
		e2bCreate:  "Sandbox.create('base') until the first stdout of commands.run('echo ready')",
		e2bCreated: "Sandbox.create('base') until it answers",
		e2bPause:   "sandbox.pause()",
		e2bConnect: "Sandbox.connect(id) until the first stdout of commands.run('echo ready')",
		"fork":     "sandbox.fork({count}) until every fork is answered (one checkpoint, then the forks in turn)",
	}}
	cliSide = e2bSide{"", map[string]string{
		e2bCreate:  "den create (API client) until the first byte of den exec VM -- " + e2bCommand,
		e2bCreated: "den create (API client) until it answers",
		e2bPause:   "den sleep",
		e2bConnect: "den exec VM -- " + e2bCommand + " into the sleeping VM (it wakes) until its first byte",
		"fork":     "den checkpoint, then den fork VM@CP for each fork in turn (as the E2B fork is made)",
	}}
)

// e2bRun is one run's times on one side.
type e2bRun struct {
	create, created, pause, connect time.Duration
	forks                           map[int]time.Duration
}

// E2BCheck returns the node binary and bench.mjs in sdkDir, or an error
// of one line saying what to install.
func E2BCheck(sdkDir string) (node, script string, err error) {
	node, err = exec.LookPath("node")
	if err != nil {
		return "", "", errors.New("bench e2b: node is not installed (make deps-node installs nodejs, npm and the e2b SDK)")
	}
	script = filepath.Join(sdkDir, "bench.mjs")
	if _, err := os.Stat(script); err != nil {
		return "", "", fmt.Errorf("bench e2b: no bench.mjs in %s (run den bench --e2b from den's source tree, or give --e2b-sdk DIR)", sdkDir)
	}
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "e2b", "package.json")); err != nil {
		return "", "", fmt.Errorf("bench e2b: the e2b SDK is not installed in %s (run make deps-node)", sdkDir)
	}
	return node, script, nil
}

// e2b takes the E2B figures on the daemon, which listens for E2B
// (--e2b-listen): a warm-up of both paths (fork x4 only), then o.Runs runs
// of each.
func (d *daemon) e2b(ctx context.Context, o Options, accel string, say func(string)) ([]Figure, error) {
	node, script, err := E2BCheck(o.E2BSDK)
	if err != nil {
		return nil, err
	}
	info, err := d.client.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench e2b: %w", err)
	}
	if info.E2B == "" {
		return nil, errors.New("bench e2b: the daemon serves no E2B API (--e2b-listen)")
	}
	tok, err := d.client.AddToken(ctx, api.AddTokenRequest{Name: "bench-e2b"})
	if err != nil {
		return nil, fmt.Errorf("bench e2b: token: %w", err)
	}
	sdk := func(ctx context.Context, forks []int) (e2bRun, error) {
		return sdkRun(ctx, node, script, info.E2B, tok.Secret, forks)
	}
	var sdkRuns, cliRuns []e2bRun
	for i := 0; i <= o.Runs; i++ { // the first is a warm-up
		forks := e2bForks
		if i == 0 {
			forks = e2bForks[:1]
		}
		sdkFirst := i%2 == 0
		of := fmt.Sprintf("%d/%d", i, o.Runs)
		if i == 0 {
			of = "warm-up"
		}
		for k := range 2 {
			rctx, cancel := context.WithTimeout(ctx, e2bRunTimeout)
			var r e2bRun
			var err error
			if (k == 0) == sdkFirst {
				say(fmt.Sprintf("e2b sdk: create, pause, connect, fork x%v (%s)", forks, of))
				r, err = sdk(rctx, forks)
				if i > 0 {
					sdkRuns = append(sdkRuns, r)
				}
			} else {
				say(fmt.Sprintf("den cli path: create, sleep, exec, fork x%v (%s)", forks, of))
				r, err = d.cliRun(rctx, fmt.Sprintf("e%d", i), forks)
				if i > 0 {
					cliRuns = append(cliRuns, r)
				}
			}
			cancel()
			if err != nil {
				return nil, fmt.Errorf("bench e2b: run %d: %w", i, err)
			}
		}
	}
	figs := e2bFigures(d.vmm, accel, sdkSide, sdkRuns)
	return append(figs, e2bFigures(d.vmm, accel, cliSide, cliRuns)...), nil
}

// e2bFigures makes the figures of one side's runs, with p99s.
func e2bFigures(vmmName, accel string, side e2bSide, runs []e2bRun) []Figure {
	var figs []Figure
	add := func(name, note string, ds []time.Duration) {
		f := figure(name, vmmName+side.suffix, accel, "512M", ds)
		f.P99, f.Note = percentile(f.Samples, 99), note
		figs = append(figs, f)
	}
	pick := func(f func(e2bRun) time.Duration) []time.Duration {
		var ds []time.Duration
		for _, r := range runs {
			ds = append(ds, f(r))
		}
		return ds
	}
	add(e2bCreate, side.notes[e2bCreate], pick(func(r e2bRun) time.Duration { return r.create }))
	add(e2bCreated, side.notes[e2bCreated], pick(func(r e2bRun) time.Duration { return r.created }))
	add(e2bPause, side.notes[e2bPause], pick(func(r e2bRun) time.Duration { return r.pause }))
	add(e2bConnect, side.notes[e2bConnect], pick(func(r e2bRun) time.Duration { return r.connect }))
	for _, n := range e2bForks {
		add(e2bForkTotal(n), side.notes["fork"], pick(func(r e2bRun) time.Duration { return r.forks[n] }))
		add(e2bForkEach(n), side.notes["fork"]+", divided by the count", pick(func(r e2bRun) time.Duration { return r.forks[n] / time.Duration(n) }))
	}
	return figs
}

// sdkRun runs bench.mjs once: one run of the SDK side.
func sdkRun(ctx context.Context, node, script, url, key string, forks []int) (e2bRun, error) {
	counts := make([]string, len(forks))
	for i, n := range forks {
		counts[i] = strconv.Itoa(n)
	}
	cmd := exec.CommandContext(ctx, node, filepath.Base(script))
	cmd.Dir = filepath.Dir(script)
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key,
		"DEN_E2B_BENCH_RUNS=1", "DEN_E2B_BENCH_FORKS="+strings.Join(counts, ","))
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return e2bRun{}, fmt.Errorf("e2b sdk: %w: %s", err, strings.TrimSpace(tail(stderr.Bytes(), 2000)))
	}
	var out struct {
		Create  float64            `json:"create_ms"`
		Created float64            `json:"created_ms"`
		Pause   float64            `json:"pause_ms"`
		Connect float64            `json:"connect_ms"`
		Forks   map[string]float64 `json:"fork_ms"`
	}
	line, _, _ := bufio.NewReader(&stdout).ReadLine()
	if err := json.Unmarshal(line, &out); err != nil {
		return e2bRun{}, fmt.Errorf("e2b sdk: its output %q: %w", line, err)
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	r := e2bRun{create: ms(out.Create), created: ms(out.Created), pause: ms(out.Pause), connect: ms(out.Connect), forks: map[int]time.Duration{}}
	for _, n := range forks {
		v, ok := out.Forks[strconv.Itoa(n)]
		if !ok {
			return e2bRun{}, fmt.Errorf("e2b sdk: no fork x%d time in %q", n, line)
		}
		r.forks[n] = ms(v)
	}
	return r, nil
}

// cliRun is one run of the CLI side on a VM called name: den create and a
// first exec's output, den sleep, an exec's output (the wake), and for
// each count a checkpoint and that many forks of it. Its commands are
// e2bCommand.
func (d *daemon) cliRun(ctx context.Context, name string, forks []int) (r e2bRun, err error) {
	r.forks = map[int]time.Duration{}
	made := []string{name}
	defer func() { d.removeAll(context.WithoutCancel(ctx), made) }()
	start := time.Now()
	if r.create, err = timed(func() error {
		if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name}, nil); err != nil {
			return err
		}
		r.created = time.Since(start)
		_, err := d.firstOutputOf(ctx, name, e2bCommand)
		return err
	}); err != nil {
		return r, fmt.Errorf("den create %s: %w", name, err)
	}
	if r.pause, err = timed(func() error { _, err := d.client.Sleep(ctx, name, api.SleepRequest{}); return err }); err != nil {
		return r, fmt.Errorf("den sleep %s: %w", name, err)
	}
	if r.connect, err = d.firstOutputOf(ctx, name, e2bCommand); err != nil {
		return r, fmt.Errorf("den exec %s (wake): %w", name, err)
	}
	for _, n := range forks {
		var names []string
		t, err := timed(func() error {
			cp, err := d.client.Checkpoint(ctx, name, api.CheckpointRequest{Comment: fmt.Sprintf("bench fork x%d", n)}, nil)
			if err != nil {
				return err
			}
			for j := range n {
				f := fmt.Sprintf("%s-x%d-%d", name, n, j)
				if _, err := d.client.Fork(ctx, name, api.ForkRequest{Checkpoint: cp.ID, Name: f}, nil); err != nil {
					return err
				}
				names = append(names, f)
			}
			return nil
		})
		made = append(made, names...)
		if err != nil {
			return r, fmt.Errorf("den fork %s x%d: %w", name, n, err)
		}
		r.forks[n] = t
		d.removeAll(ctx, names)
		made = made[:1]
	}
	return r, nil
}

// removeAll removes the VMs names (force), in parallel, as the SDK side
// kills its sandboxes.
func (d *daemon) removeAll(ctx context.Context, names []string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.client.RemoveVM(ctx, n, true) }()
	}
	wg.Wait()
}

// e2bRatios are the SDK's figures over the CLI path's, p50 and p99 (the
// goal: at most 1.2).
func (r *Result) e2bRatios(v string, put func(string, float64, float64)) {
	names := []string{e2bCreate, e2bCreated, e2bPause, e2bConnect}
	for _, n := range e2bForks {
		names = append(names, e2bForkTotal(n), e2bForkEach(n))
	}
	for _, name := range names {
		sdk, cli := r.figure(name, v+sdkSide.suffix), r.figure(name, v+cliSide.suffix)
		if sdk == nil || cli == nil {
			continue
		}
		put("e2b sdk / cli, "+name+", p50", sdk.Median, cli.Median)
		put("e2b sdk / cli, "+name+", p99", sdk.P99, cli.P99)
	}
}

// figure is the figure name of vmmName, nil if absent.
func (r *Result) figure(name, vmmName string) *Figure {
	for i := range r.Figures {
		if r.Figures[i].Name == name && r.Figures[i].VMM == vmmName {
			return &r.Figures[i]
		}
	}
	return nil
}
