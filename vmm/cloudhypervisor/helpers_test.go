package cloudhypervisor

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// testCtx is a context that ends with the test or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTestVMM is a driver on a fresh short run directory, with no process.
func newTestVMM(t *testing.T) (*VMM, vmm.RunDir) {
	t.Helper()
	rd := vmm.RunDir(shortDir(t))
	return New(Options{RunDir: rd, Logger: testLogger(t)}), rd
}

// transcriptConfig is the VM the transcripts created: 1 vCPU, 256 MiB,
// one disk "root".
func transcriptConfig() vmm.Config {
	return vmm.Config{
		CPUs:        1,
		MemoryBytes: 256 << 20,
		Kernel:      "/var/lib/den/images/debian-12/vmlinuz",
		Initramfs:   "/var/lib/den/images/debian-12/initrd.img",
		Cmdline:     "console=ttyS0 panic=-1",
		Disks:       []vmm.Disk{{ID: "root", Path: "/run/den/vms/demo/disk.raw"}},
	}
}

// raw sends a request the typed methods never send (bad bodies, endpoints
// den does not use), to check how their errors come back.
func raw(ctx context.Context, v *VMM, method, endpoint string, body any) error {
	return v.call(ctx, method, endpoint, body, nil)
}

// wantErr checks that err is an *APIError with this status whose text is
// exactly want, and whether it wraps vmm.ErrInvalidState.
func wantErr(t *testing.T, err error, status int, want string, invalidState bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %q (%T) is no *APIError", err, err)
	}
	if apiErr.Status != status {
		t.Errorf("status %d, want %d (%v)", apiErr.Status, status, err)
	}
	if err.Error() != want {
		t.Errorf("error text\n got: %s\nwant: %s", err, want)
	}
	if got := errors.Is(err, vmm.ErrInvalidState); got != invalidState {
		t.Errorf("errors.Is(%q, ErrInvalidState) = %v, want %v", err, got, invalidState)
	}
}

// wantState checks Info's state.
func wantState(t *testing.T, ctx context.Context, v *VMM, want vmm.State) vmm.Info {
	t.Helper()
	info, err := v.Info(ctx)
	if err != nil {
		t.Fatalf("info: %v", err)
	}
	if info.State != want {
		t.Fatalf("state %s, want %s", info.State, want)
	}
	return info
}

// must fails the test on an error.
func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// pathPut is the replay key of a PUT to an endpoint.
func pathPut(endpoint string) string { return http.MethodPut + " " + apiBase + endpoint }

// writeFile writes a test file.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
