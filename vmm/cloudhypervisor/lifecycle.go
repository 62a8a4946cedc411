package cloudhypervisor

// The VMM process: start, adopt, shut down, and the log its errors quote.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/vmm"
)

// Adopt re-attaches to the cloud-hypervisor process recorded in
// opts.RunDir by an earlier Start, typically after the caller restarted.
// It fails wrapping vmm.ErrNotRunning when the process is gone. A process
// that runs but whose API socket does not answer within ctx is an error
// too; Adopt never stops it (the error names its PID and log).
func Adopt(ctx context.Context, opts Options) (*VMM, error) {
	v := New(opts)
	p, err := vmm.AdoptProcess(opts.RunDir.PIDFile())
	if err != nil {
		return nil, fmt.Errorf("adopt cloud-hypervisor in %s: %w", opts.RunDir.Path(), err)
	}
	v.mu.Lock()
	v.proc = p
	v.logFrom = -1
	v.mu.Unlock()
	if _, err := v.Ping(ctx); err != nil {
		return nil, fmt.Errorf("adopt cloud-hypervisor pid %d: api socket %s does not answer: %w%s",
			p.PID(), opts.RunDir.APISocket(), err, v.logNote())
	}
	v.log.Info("adopted", "pid", p.PID(), "version", v.cachedVersion())
	return v, nil
}

// Start launches cloud-hypervisor and waits, within ctx, until its API
// answers vmm.ping. The process does not depend on ctx. If the process
// exits or its socket never answers, the error says so and quotes the
// VMM log; a process that did not answer in time is stopped.
func (v *VMM) Start(ctx context.Context) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	if p := v.process(); p != nil && p.Alive() {
		return fmt.Errorf("start cloud-hypervisor: already running as pid %d", p.PID())
	}
	bin := v.opts.Binary
	if bin == "" {
		return errors.New("start cloud-hypervisor: no binary given (see FindBinary)")
	}
	if strings.Contains(bin, "/") {
		// The process runs in the run dir: a relative path would not
		// resolve there.
		abs, err := filepath.Abs(bin)
		if err != nil {
			return fmt.Errorf("start cloud-hypervisor: %w", err)
		}
		bin = abs
	}
	rd := v.opts.RunDir
	for _, s := range []string{rd.APISocket(), rd.VsockSocket()} {
		if len(s) > maxSocketPath {
			return fmt.Errorf("start cloud-hypervisor: socket path %s is %d bytes, longer than %d: use a shorter run dir", s, len(s), maxSocketPath)
		}
	}
	if err := os.MkdirAll(rd.Path(), 0o750); err != nil {
		return fmt.Errorf("start cloud-hypervisor: %w", err)
	}
	if socketAnswers(ctx, rd.APISocket()) {
		return fmt.Errorf("start cloud-hypervisor: another process already listens on %s (adopt it instead)", rd.APISocket())
	}
	// Cloud Hypervisor refuses to bind over a socket file left by a VMM
	// that died.
	removeStaleSocket(rd.APISocket())
	removeStaleSocket(rd.VsockSocket())

	logFrom := markLog(rd.Log(), bin)
	args := []string{"--api-socket", "path=" + rd.APISocket()}
	for i := 0; i < v.opts.Verbosity; i++ {
		args = append(args, "-v")
	}
	if u := v.opts.Confine.User; u != nil {
		if err := u.Own(rd.Path(), rd.ConsoleLog()); err != nil {
			return fmt.Errorf("start cloud-hypervisor: %w", err)
		}
	}
	p, err := vmm.StartProcess(vmm.ProcessSpec{
		Binary:  bin,
		Args:    args,
		Log:     rd.Log(),
		PIDFile: rd.PIDFile(),
		Dir:     rd.Path(),
		Confine: v.opts.Confine,
	})
	if err != nil {
		return fmt.Errorf("start cloud-hypervisor: %w", err)
	}
	v.mu.Lock()
	v.proc = p
	v.logFrom = logFrom
	v.mu.Unlock()
	v.log.Info("started", "pid", p.PID(), "binary", bin)

	start := time.Now()
	var lastErr error
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		var r VmmPingResponse
		err := v.client.do(pctx, http.MethodGet, "vmm.ping", nil, &r)
		pcancel()
		if err == nil {
			v.setVersion(r)
			v.log.Info("api ready", "pid", p.PID(), "after", time.Since(start).Round(time.Millisecond), "version", v.cachedVersion())
			return nil
		}
		lastErr = err
		select {
		case <-p.Exited():
			_ = os.Remove(rd.PIDFile())
			return fmt.Errorf("start cloud-hypervisor: the process exited before its api socket answered (%v)%s",
				p.Err(), v.logNote())
		case <-ctx.Done():
			stopped := fmt.Sprintf("; stopped pid %d", p.PID())
			if err := p.Stop(time.Second); err != nil {
				stopped = fmt.Sprintf("; stopping pid %d failed: %v", p.PID(), err)
			} else {
				_ = os.Remove(rd.PIDFile())
			}
			return fmt.Errorf("start cloud-hypervisor: api socket %s did not answer within %s (last try: %v)%s%s: %w",
				rd.APISocket(), time.Since(start).Round(time.Millisecond), lastErr, stopped, v.logNote(), ctx.Err())
		case <-tick.C:
		}
	}
}

// markLog appends a line saying a new process starts, and returns the
// log's size after it so that errors quote only this process's output.
func markLog(path, binary string) int64 {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return 0
	}
	defer f.Close()
	fmt.Fprintf(f, "den: %s starting %s\n", time.Now().UTC().Format(time.RFC3339), binary)
	st, err := f.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}

// logNote is "; log PATH ends: "..."" for error messages, quoting what the
// current process wrote (or the log's tail for an adopted one).
func (v *VMM) logNote() string {
	v.mu.Lock()
	from := v.logFrom
	v.mu.Unlock()
	path := v.opts.RunDir.Log()
	if _, err := os.Stat(path); err != nil {
		return fmt.Sprintf("; no log at %s", path)
	}
	tail := logTail(path, from, logTailBytes)
	switch {
	case tail != "":
		return fmt.Sprintf("; log %s ends: %q", path, tail)
	case from > 0:
		return fmt.Sprintf("; the process wrote nothing to its log %s", path)
	default:
		return fmt.Sprintf("; log %s is empty", path)
	}
}

// logTail is the last n bytes written to path at or after offset from
// (from < 0: anywhere), as one line.
func logTail(path string, from, n int64) string {
	if from <= 0 {
		return vmm.TailFile(path, n)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() <= from {
		return ""
	}
	if st.Size()-from < n {
		n = st.Size() - from
	}
	return vmm.TailFile(path, n)
}

// socketAnswers reports whether something accepts connections on a unix
// socket.
func socketAnswers(ctx context.Context, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// removeStaleSocket deletes a socket file nobody listens on.
func removeStaleSocket(path string) {
	if _, err := os.Lstat(path); err != nil {
		return
	}
	if socketAnswers(context.Background(), path) {
		return
	}
	_ = os.Remove(path)
}

// Shutdown stops the VM (vm.shutdown, best effort) and the VMM
// (vmm.shutdown), then makes sure the process is gone: SIGTERM after
// StopGrace, SIGKILL after another. It returns when the process has exited
// and its sockets, PID file and private restore directory are removed.
// Without a process (New without Start or Adopt) it can only ask the API,
// and fails if the socket still answers afterwards.
func (v *VMM) Shutdown(ctx context.Context) error {
	ctx, cancel := vmm.WithDefaultTimeout(ctx)
	defer cancel()
	p := v.process()
	if p == nil || p.Alive() {
		v.bestEffort(ctx, "vm.shutdown")
		v.bestEffort(ctx, "vmm.shutdown")
	}
	if p == nil {
		return v.waitSocketGone(ctx)
	}
	grace := v.opts.StopGrace
	if dl, ok := ctx.Deadline(); ok && time.Until(dl)/2 < grace {
		grace = max(time.Until(dl)/2, 100*time.Millisecond)
	}
	select {
	case <-p.Exited():
	case <-time.After(grace):
		v.log.Warn("vmm did not exit after vmm.shutdown; terminating", "pid", p.PID())
		if err := p.Stop(grace); err != nil {
			return fmt.Errorf("ch shutdown: %w", err)
		}
	}
	v.cleanup()
	v.log.Info("stopped", "pid", p.PID(), "exit", p.Err())
	return nil
}

// Discard kills the VMM (SIGKILL) and removes its sockets, PID file and
// restore directory; without a process (see Adopt) it shuts it down.
func (v *VMM) Discard(ctx context.Context) error {
	p := v.process()
	if p == nil {
		return v.Shutdown(ctx)
	}
	if err := p.Kill(); err != nil {
		return fmt.Errorf("ch discard: %w", err)
	}
	v.cleanup()
	v.log.Info("discarded", "pid", p.PID())
	return nil
}

// waitSocketGone waits up to a second (even when ctx has ended: an
// unanswered dial must not pass for a socket gone) for the API socket of
// a VMM this driver has no process for to stop answering, then removes
// what is left of it.
func (v *VMM) waitSocketGone(ctx context.Context) error {
	// Each probe dials with a time of its own: a dial cut short by the
	// wait's end would pass for a socket gone (a flaky test once).
	deadline := time.Now().Add(time.Second)
	sock := v.opts.RunDir.APISocket()
	for socketAnswers(context.WithoutCancel(ctx), sock) {
		if time.Now().After(deadline) {
			return fmt.Errorf("ch shutdown: %s still answers after vmm.shutdown, and this driver has no process to stop (see Adopt)", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	removeStaleSocket(sock)
	removeStaleSocket(v.opts.RunDir.VsockSocket())
	_ = os.RemoveAll(v.restoreDir())
	return nil
}

// bestEffort sends a PUT whose failure Shutdown can live with.
func (v *VMM) bestEffort(ctx context.Context, endpoint string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := v.call(ctx, http.MethodPut, endpoint, nil, nil); err != nil {
		v.log.Debug("shutdown step failed", "endpoint", endpoint, "err", err)
	}
}

// cleanup removes what a stopped VMM leaves in the run directory.
func (v *VMM) cleanup() {
	rd := v.opts.RunDir
	for _, p := range []string{rd.APISocket(), rd.VsockSocket(), rd.PIDFile()} {
		_ = os.Remove(p)
	}
	_ = os.RemoveAll(v.restoreDir())
	// Sockets of guest-initiated vsock connections: vsock.sock_<port>.
	if m, err := filepath.Glob(rd.VsockSocket() + "_*"); err == nil {
		for _, p := range m {
			_ = os.Remove(p)
		}
	}
}
