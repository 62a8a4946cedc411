package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// These tests run the test binary itself as a fake cloud-hypervisor (see
// fake_test.go): real processes, real sessions, PID files and signals.

// fakeVMM writes fake.json into a fresh run dir and returns a driver
// whose binary is the test binary.
func fakeVMM(t *testing.T, cfg fakeConfig, opts Options) (*VMM, vmm.RunDir) {
	t.Helper()
	self, err := os.Executable()
	must(t, "test binary", err)
	rd := vmm.RunDir(shortDir(t))
	if cfg.Ping.Path == "" {
		cfg.Ping = pingEntry(t)
	}
	data, err := json.Marshal(cfg)
	must(t, "encode fake config", err)
	writeFile(t, filepath.Join(rd.Path(), "fake.json"), data)
	opts.Binary = self
	opts.RunDir = rd
	opts.Logger = testLogger(t)
	v := New(opts)
	t.Cleanup(func() { stopLeftover(t, v) })
	return v, rd
}

// stopLeftover kills a fake process a failed test left running.
func stopLeftover(t *testing.T, v *VMM) {
	if p := v.process(); p != nil && p.Alive() {
		t.Logf("stopping leftover fake vmm %d", p.PID())
		_ = p.Stop(time.Second)
	}
}

// waitExited waits (bounded) for the process to be gone.
func waitExited(t *testing.T, v *VMM, within time.Duration) {
	t.Helper()
	select {
	case <-v.Exited():
	case <-time.After(within):
		t.Fatalf("vmm process %d still running after %s", v.PID(), within)
	}
}

func TestStartAdoptShutdown(t *testing.T) {
	v, rd := fakeVMM(t, fakeConfig{Mode: "replay", Entries: segment(t, snapTranscript, 1)}, Options{})
	ctx := testCtx(t, 30*time.Second)
	must(t, "start", v.Start(ctx))
	pid := v.PID()
	if pid == 0 || v.Capabilities().Version != "v53.0-246-gae44c2971-dirty" {
		t.Fatalf("pid %d, version %q", pid, v.Capabilities().Version)
	}
	if err := v.Start(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second start: %v", err)
	}
	for _, f := range []string{rd.PIDFile(), rd.APISocket(), rd.Log()} {
		if _, err := os.Stat(f); err != nil {
			t.Error(err)
		}
	}

	// The caller "restarts": a new driver adopts the running process.
	a, err := Adopt(ctx, Options{RunDir: rd, Binary: v.opts.Binary, Logger: testLogger(t)})
	must(t, "adopt", err)
	if a.PID() != pid || a.Capabilities().Version == "" {
		t.Errorf("adopted pid %d (want %d), version %q", a.PID(), pid, a.Capabilities().Version)
	}
	snap := fakeSnapshot(t)
	must(t, "restore via the adopted driver", a.Restore(ctx, snap, vmm.RestoreOptions{}))
	wantState(t, ctx, a, vmm.StatePaused)
	must(t, "resume", a.Resume(ctx))
	wantState(t, ctx, a, vmm.StateRunning)

	must(t, "shutdown", a.Shutdown(ctx))
	waitExited(t, a, 5*time.Second)
	waitExited(t, v, 5*time.Second)
	if v.ExitErr() == nil || !strings.Contains(v.ExitErr().Error(), "status 0") {
		t.Errorf("exit: %v, want a clean exit", v.ExitErr())
	}
	for _, f := range []string{rd.PIDFile(), rd.APISocket()} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left after shutdown: %v", f, err)
		}
	}
	// Nothing left to adopt.
	if _, err := Adopt(ctx, Options{RunDir: rd}); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("adopt after shutdown: %v", err)
	}
	// Calls on a driver whose process is gone say so at once.
	_, err = v.Info(ctx)
	if !errors.Is(err, vmm.ErrNotRunning) || !strings.Contains(err.Error(), rd.Log()) {
		t.Errorf("info after exit: %v", err)
	}
}

// The VMM process exits before its socket answers: the error says so and
// quotes the log.
func TestStartProcessExits(t *testing.T) {
	v, rd := fakeVMM(t, fakeConfig{Mode: "exit"}, Options{})
	err := v.Start(testCtx(t, 30*time.Second))
	if err == nil {
		t.Fatal("start succeeded")
	}
	for _, want := range []string{"exited before its api socket answered", "exit status 1", rd.Log(), "simulated failure"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// The socket never appears: Start gives up at its context's deadline,
// stops the process and quotes the log.
func TestStartSocketNeverAppears(t *testing.T) {
	v, rd := fakeVMM(t, fakeConfig{Mode: "nosocket"}, Options{})
	start := time.Now()
	err := v.Start(testCtx(t, 1500*time.Millisecond))
	if err == nil {
		t.Fatal("start succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("start took %s", d)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap the deadline", err)
	}
	for _, want := range []string{"did not answer within", rd.APISocket(), "stopped pid", rd.Log(), "never opening the api socket"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	waitExited(t, v, 5*time.Second)
}

// The process dies in the middle of a call: the error wraps ErrNotRunning
// and quotes the log, not a bare EOF.
func TestVMMExitsMidCall(t *testing.T) {
	v, rd := fakeVMM(t, fakeConfig{
		Mode:    "replay",
		Entries: segment(t, snapTranscript, 0),
		CrashOn: pathPut("vm.pause"),
	}, Options{})
	ctx := testCtx(t, 30*time.Second)
	must(t, "start", v.Start(ctx))
	must(t, "create", v.Create(ctx, transcriptConfig()))
	must(t, "boot", v.Boot(ctx))
	err := v.Pause(ctx)
	if !errors.Is(err, vmm.ErrNotRunning) {
		t.Fatalf("pause: %v, want ErrNotRunning", err)
	}
	for _, want := range []string{"ch pause: vmm process exited during the call", "exit status 101", rd.Log(), "simulated crash on PUT /api/v1/vm.pause"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_, err = v.Info(ctx)
	if !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("info after the crash: %v", err)
	}
	must(t, "shutdown of a dead vmm", v.Shutdown(ctx))
}

// A VMM that ignores vmm.shutdown and SIGTERM is killed.
func TestShutdownKillsStubbornVMM(t *testing.T) {
	v, _ := fakeVMM(t, fakeConfig{
		Mode:              "replay",
		Entries:           segment(t, snapTranscript, 1),
		IgnoreTerm:        true,
		StayAfterShutdown: true,
	}, Options{StopGrace: 200 * time.Millisecond})
	ctx := testCtx(t, 30*time.Second)
	must(t, "start", v.Start(ctx))
	start := time.Now()
	must(t, "shutdown", v.Shutdown(ctx))
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %s", d)
	}
	waitExited(t, v, time.Second)
	if err := v.ExitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("exit: %v, want killed", err)
	}
	if err := syscall.Kill(v.PID(), 0); err == nil {
		t.Errorf("process %d still exists", v.PID())
	}
}

func TestAdoptErrors(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	rd := vmm.RunDir(shortDir(t))
	if _, err := Adopt(ctx, Options{RunDir: rd}); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("adopt without pid file: %v", err)
	}

	// A live process whose socket does not answer.
	v, rd := fakeVMM(t, fakeConfig{Mode: "nosocket"}, Options{})
	self, _ := os.Executable()
	p, err := vmm.StartProcess(vmm.ProcessSpec{
		Binary: self, Args: []string{"--api-socket", "path=" + rd.APISocket()},
		Log: rd.Log(), PIDFile: rd.PIDFile(), Dir: rd.Path(),
	})
	must(t, "start fake", err)
	defer p.Stop(time.Second)
	_ = v
	actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = Adopt(actx, Options{RunDir: rd})
	if err == nil || !strings.Contains(err.Error(), "does not answer") || !strings.Contains(err.Error(), rd.Log()) {
		t.Errorf("adopt of a process without socket: %v", err)
	}
	if !p.Alive() {
		t.Error("Adopt stopped the process")
	}
}

// Start refuses to run a second VMM on a socket something answers on.
func TestStartRefusesLiveSocket(t *testing.T) {
	v, rd := fakeVMM(t, fakeConfig{Mode: "replay"}, Options{})
	startReplay(t, rd.APISocket())
	err := v.Start(testCtx(t, 10*time.Second))
	if err == nil || !strings.Contains(err.Error(), "already listens") {
		t.Errorf("start over a live socket: %v", err)
	}
	if v.PID() != 0 {
		t.Errorf("a process was started: %d", v.PID())
	}
}

// Start removes a stale socket file a dead VMM left, and runs a binary
// given by a relative path although the process runs in the run dir.
func TestStartRemovesStaleSocket(t *testing.T) {
	v, rd := fakeVMM(t, fakeConfig{Mode: "replay", Entries: segment(t, snapTranscript, 1)}, Options{})
	writeFile(t, rd.APISocket(), nil)
	wd, err := os.Getwd()
	must(t, "getwd", err)
	rel, err := filepath.Rel(wd, v.opts.Binary)
	must(t, "relative binary path", err)
	if !strings.Contains(rel, "/") {
		rel = "./" + rel
	}
	v.opts.Binary = rel
	ctx := testCtx(t, 30*time.Second)
	must(t, "start", v.Start(ctx))
	must(t, "shutdown", v.Shutdown(ctx))
}

func TestStartLongRunDir(t *testing.T) {
	rd := vmm.RunDir("/tmp/" + strings.Repeat("x", 100))
	err := New(Options{RunDir: rd, Binary: "/bin/true"}).Start(testCtx(t, time.Second))
	if err == nil || !strings.Contains(err.Error(), "shorter run dir") {
		t.Errorf("long run dir: %v", err)
	}
}
