package vmm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/internal/poll"
)

func TestProcessStartAdoptStop(t *testing.T) {
	dir := t.TempDir()
	rd := RunDir(dir)
	p, err := StartProcess(ProcessSpec{Binary: "/bin/sh", Args: []string{"-c", "echo started; exec sleep 60"}, Log: rd.Log(), PIDFile: rd.PIDFile()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(time.Second) })
	if !p.Alive() || p.PID() <= 0 {
		t.Fatalf("process not alive: pid %d", p.PID())
	}
	// Its output reaches the log (before it is stopped, which may come
	// before the shell ran echo on a loaded machine).
	if !logShows(rd.Log(), "started") {
		data, _ := os.ReadFile(rd.Log())
		t.Fatalf("log %q lacks the process output", data)
	}
	// A second supervisor (a restarted daemon) adopts it from the PID file.
	a, err := AdoptProcess(rd.PIDFile())
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	if a.PID() != p.PID() {
		t.Fatalf("adopted pid %d, want %d", a.PID(), p.PID())
	}
	if err := p.Stop(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("adopted process exit not noticed")
	}
	if p.Err() == nil || a.Err() == nil {
		t.Fatalf("exit not recorded: %v / %v", p.Err(), a.Err())
	}
	if _, err := AdoptProcess(rd.PIDFile()); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("adopt of a dead process: %v, want ErrNotRunning", err)
	}
}

// logShows waits (bounded) until the log file holds want.
func logShows(log, want string) bool {
	return poll.Until(30*time.Second, func() bool {
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), want)
	})
}

func TestProcessStopEscalatesToSIGKILL(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	p, err := StartProcess(ProcessSpec{Binary: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo trapped; while :; do sleep 1; done"}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if !logShows(log, "trapped") { // the shell ignores SIGTERM from here
		t.Fatal("the shell did not start")
	}
	if err := p.Stop(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p.Alive() {
		t.Fatal("process survived Stop")
	}
}

func TestAdoptMissingOrCorruptPIDFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := AdoptProcess(filepath.Join(dir, "none")); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("missing pid file: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("{"), 0o600)
	if _, err := AdoptProcess(bad); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt pid file: %v", err)
	}
}

func TestCheckTransition(t *testing.T) {
	if err := CheckTransition("pause", StateRunning); err != nil {
		t.Fatal(err)
	}
	err := CheckTransition("pause", StatePaused)
	if !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "Paused") {
		t.Fatalf("pause of paused vm: %v", err)
	}
	if err := CheckTransition("bogus", StateRunning); err == nil {
		t.Fatal("unknown op accepted")
	}
}
