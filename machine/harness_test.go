//go:build linux

package machine_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/pgtest"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/machine/machinetest"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
)

// testTimeout bounds every test's operations.
const testTimeout = 60 * time.Second

// env is a Manager on a fake VMM and a directory volume.
type env struct {
	t      *testing.T
	m      *machine.Manager
	drv    *machinetest.Driver
	vol    *machinetest.Volume
	state  machine.StateDir
	images image.Dir
	cfg    machine.Config
	reg    registry.Store // the Manager's registry, open across restarts
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// newRegistry opens the registry a test's Manager uses: SQLite in the
// state dir, or, with DEN_TEST_REGISTRY=postgres, a fresh database of the
// test's own on a real PostgreSQL (make test runs the package both ways).
// It is closed when the test ends, after the Manager.
func newRegistry(t *testing.T, state machine.StateDir) registry.Store {
	t.Helper()
	var db registry.Store
	var err error
	switch b := os.Getenv("DEN_TEST_REGISTRY"); b {
	case "", "sqlite":
		if err := os.MkdirAll(state.Path(), 0o700); err != nil {
			t.Fatal(err)
		}
		db, err = registry.Open(state.DB())
	case "postgres":
		db, err = registry.OpenPostgres(context.Background(), pgtest.Shared(t).NewDatabase(t))
	default:
		t.Fatalf("DEN_TEST_REGISTRY=%q: want sqlite or postgres", b)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// imageSize is the fake image's root disk: VMs made with this disk size
// need no growing.
const imageSize = 8 << 20

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, nil)
}

// newEnvWith is newEnv with the Manager's config changed by tweak first
// (nil: none).
func newEnvWith(t *testing.T, tweak func(*machine.Config)) *env {
	t.Helper()
	dir := t.TempDir()
	images := image.Dir(filepath.Join(dir, "images"))
	if err := os.MkdirAll(images.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	man := image.Manifest{Format: 1, Artifacts: []image.Artifact{{Name: image.Minimal, Kind: "rootfs", Key: "0123456789abcdef0123"}}}
	data, _ := json.Marshal(man)
	if err := os.WriteFile(images.ManifestPath(), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{images.BzImage(), images.Vmlinux(), images.Initramfs()} {
		// Imported onto the volume by content at each create: a fake
		// VMM boots nothing from them.
		if err := os.WriteFile(f, []byte("fake "+filepath.Base(f)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(images.RootDisk(image.Minimal), []byte("fake ext4"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(images.RootDisk(image.Minimal), imageSize); err != nil {
		t.Fatal(err)
	}
	vol, err := machinetest.NewVolume(filepath.Join(dir, "volume"))
	if err != nil {
		t.Fatal(err)
	}
	drv := machinetest.NewDriver()
	e := &env{t: t, drv: drv, vol: vol, state: machine.StateDir(filepath.Join(dir, "state")), images: images}
	e.reg = newRegistry(t, e.state)
	e.cfg = machine.Config{
		Registry: e.reg,
		State:    e.state, Volume: vol, Images: images, DefaultImage: image.Minimal, VMM: machinetest.Name,
		Drivers:     map[string]vmm.Driver{machinetest.Name: drv},
		BootTimeout: 20 * time.Second, LockWait: 20 * time.Second, DrainTimeout: 20 * time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if tweak != nil {
		tweak(&e.cfg)
	}
	e.open()
	t.Cleanup(func() { e.m.Close() })
	return e
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func (e *env) open() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	m, err := machine.New(ctx, e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.m = m
}

// restart closes the Manager and opens a new one on the same state, as
// a daemon restart does (VMMs keep running).
func (e *env) restart() {
	e.t.Helper()
	if err := e.m.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.open()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// create makes a running VM (cold: the fake has no warm base to settle).
func (e *env) create(name string) registry.VM {
	e.t.Helper()
	vm, err := e.m.Create(ctxT(e.t), machine.CreateOptions{Name: name, MemoryBytes: 128 << 20, DiskBytes: imageSize,
		IdleTimeout: 0, Cold: true}, nil)
	if err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	return vm
}

// record is a VM's record as it is in the registry.
func (e *env) record(name string) registry.VM {
	e.t.Helper()
	vm, err := e.m.Record(ctxT(e.t), name)
	if err != nil {
		e.t.Fatalf("record of %s: %v", name, err)
	}
	return vm
}

// memory is what the fake guest's RAM holds ("" when no VMM runs).
func (e *env) memory(name string) string {
	if v := e.drv.VM(e.state.Run(name)); v != nil {
		return v.Memory()
	}
	return ""
}

func (e *env) wantState(name string, want registry.State) registry.VM {
	e.t.Helper()
	vm := e.record(name)
	if vm.State != want {
		e.t.Fatalf("vm %s is %s (%s), want %s", name, vm.State, vm.Reason, want)
	}
	return vm
}

// standIn starts a process that stands in for a VMM in rd (made if it
// is missing): rd's PID file names it. It is killed when the test ends.
func standIn(t *testing.T, rd vmm.RunDir) *vmm.Process {
	t.Helper()
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	proc, err := vmm.StartProcess(vmm.ProcessSpec{Binary: sleep, Args: []string{"600"}, Log: rd.Log(), PIDFile: rd.PIDFile(), Dir: rd.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Kill() })
	return proc
}

// restartStops restarts the Manager, which must stop proc (what it
// stands for, in the failure).
func (e *env) restartStops(proc *vmm.Process, what string) {
	e.t.Helper()
	e.restart()
	select {
	case <-proc.Exited():
	case <-time.After(testTimeout):
		e.t.Fatalf("%s still runs after the restart", what)
	}
}
