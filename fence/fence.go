// Package fence stops a host's VMMs when its daemon stops renewing the
// host's leases: a guard process apart from the daemon, which a frozen,
// hung or killed daemon cannot hold back.
//
// The daemon pushes a deadline after every lease renewal (Push); the
// guard (Guard.Run) kills every VMM of the state dir once the deadline
// has passed. Deadlines are on CLOCK_BOOTTIME, which neither a change of
// the wall clock nor a suspend of the machine moves backwards, and carry
// the boot's id: a deadline from another boot has passed.
package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/vmm"
)

// Deadline is the fence file's content.
type Deadline struct {
	// Host is the host whose leases the deadline guards.
	Host string `json:"host"`
	// BootID is the kernel's boot id when the deadline was pushed.
	BootID string `json:"boot_id"`
	// At is the deadline, in CLOCK_BOOTTIME nanoseconds.
	At int64 `json:"at_boottime_ns"`
}

// Now is CLOCK_BOOTTIME, in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("fence: CLOCK_BOOTTIME: %v", err)) // Linux has had it since 2.6.39
	}
	return ts.Nano()
}

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// Push records that the VMMs may run until at (a Now value): the daemon
// calls it after each renewal, with the time it started the renewal plus
// half the lease.
func Push(file, host string, at int64) error {
	if err := atomicfile.ReplaceJSON(file, Deadline{Host: host, BootID: bootID(), At: at}, 0o600); err != nil {
		return fmt.Errorf("push fence deadline: %w", err)
	}
	return nil
}

// Lift removes the deadline: the host holds no lease any more and runs
// no VMM, and the guard exits.
func Lift(file string) error {
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lift fence: %w", err)
	}
	return nil
}

// Passed reads the deadline: passed says it is over (or from another
// boot); ok false when there is no deadline (lifted).
func Passed(file string) (passed, ok bool, err error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	var d Deadline
	if err := json.Unmarshal(data, &d); err != nil {
		// A deadline that cannot be read protects nothing: it passed.
		return true, true, nil
	}
	return d.BootID != bootID() || Now() >= d.At, true, nil
}

// live adopts every live VMM whose run dir is under runs, by run dir
// name.
func live(runs string) (map[string]*vmm.Process, error) {
	ents, err := os.ReadDir(runs)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := map[string]*vmm.Process{}
	for _, e := range ents {
		rd := vmm.RunDir(filepath.Join(runs, e.Name()))
		if p, err := vmm.AdoptProcess(rd.PIDFile()); err == nil {
			out[rd.Name()] = p
		}
	}
	return out, nil
}

// Live lists the run dirs under runs whose VMM runs.
func Live(runs string) ([]string, error) {
	ents, err := os.ReadDir(runs)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if vmm.Recorded(vmm.RunDir(filepath.Join(runs, e.Name())).PIDFile()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// KillVMMs kills every live VMM whose run dir is under runs, all at once,
// and returns the run dirs of those it killed once they are gone (or
// after a bounded wait).
func KillVMMs(runs string) ([]string, error) {
	procs, err := live(runs)
	if err != nil {
		return nil, err
	}
	var (
		mu     sync.Mutex
		killed []string
		errs   []error
		wg     sync.WaitGroup
	)
	for name, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := p.Kill()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			killed = append(killed, name)
		}()
	}
	wg.Wait()
	slices.Sort(killed)
	return killed, errors.Join(errs...)
}

// Guard watches a fence file and kills the VMMs under Runs whenever its
// deadline has passed.
type Guard struct {
	File string // the fence file
	Lock string // held by the one guard of a state dir
	Runs string // the VMMs' run dirs
	// Every is how often the deadline is checked (default 100 ms).
	Every time.Duration
	Log   *slog.Logger
}

// ErrRunning: another guard holds the lock.
var ErrRunning = errors.New("a fence guard runs already")

// Run guards until ctx ends or the deadline is lifted. It returns
// ErrRunning when another guard holds the lock.
func (g *Guard) Run(ctx context.Context) error {
	lf, err := os.OpenFile(g.Lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("fence guard: %w", err)
	}
	defer lf.Close()
	// Running probes the lock for a moment: a guard starting then tries
	// again, for a second, before it takes the holder for another guard.
	for try := 0; ; try++ {
		err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("fence guard: lock %s: %w", g.Lock, err)
		}
		if try == 20 {
			return ErrRunning
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The kernel's OOM killer passes the guard over: it is what keeps
	// VMMs from outliving their lease.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		g.Log.Warn("fence guard: oom_score_adj", "err", err)
	}
	every := g.Every
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		passed, ok, err := Passed(g.File)
		switch {
		case err != nil:
			// A deadline that cannot be read protects nothing.
			g.Log.Warn("fence guard: read deadline: taken as passed", "err", err)
			fallthrough
		case passed:
			killed, err := KillVMMs(g.Runs)
			if len(killed) > 0 {
				g.Log.Warn("fence guard: the leases were not renewed in time: VMMs killed", "vms", killed)
			}
			if err != nil {
				g.Log.Error("fence guard: kill VMMs", "err", err)
			}
		case !ok:
			g.Log.Info("fence guard: the deadline was lifted; exiting")
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Running reports whether a guard holds the lock.
func Running(lock string) bool {
	lf, err := os.OpenFile(lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(lf.Fd()), unix.LOCK_UN)
	return false
}
