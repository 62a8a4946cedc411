package storage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// diskWithData makes a 64 MiB disk with 4 MiB of data and returns its host
// path and checksum.
func diskWithData(t *testing.T, v Volume, vm string) (string, string) {
	t.Helper()
	ctx := context.Background()
	if err := v.CreateDisk(ctx, VMDisk(vm), 64*mib); err != nil {
		t.Fatal(err)
	}
	p, _ := v.Path(VMDisk(vm))
	writeAt(t, p, 0, 2*mib, 11)
	writeAt(t, p, 40*mib, 2*mib, 12)
	return p, sha(t, p)
}

func waitHealthy(t *testing.T, v Volume, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := v.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume not healthy within %s: %v", within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestSupervisorRemountsAfterKill(t *testing.T) {
	needIntegration(t)
	v := openVolume(t, Config{StateDir: t.TempDir()})
	fastSupervision(v)
	events, unsubscribe := v.Subscribe()
	defer unsubscribe()
	path, sum := diskWithData(t, v, "box")

	// The service process dies: juicefs's own supervisor restarts it on the
	// same FUSE connection.
	svc, sup, err := v.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("service pid %d, supervisor pid %d", svc, sup)
	if err := syscall.Kill(svc, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	waitHealthy(t, v, 30*time.Second)
	if got := sha(t, path); got != sum {
		t.Fatal("data changed after the service process was killed")
	}

	// Every juicefs process of the mount dies: den notices and remounts.
	v.mu.Lock()
	pgid := v.proc.pid
	v.mu.Unlock()
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Whichever den sees first, the exit or probes that find the FUSE
	// connection cut or hung as the processes die, it is a loss.
	waitEvent(t, events, EventLost, 10*time.Second)
	waitEvent(t, events, EventRemounted, 60*time.Second)
	waitHealthy(t, v, 10*time.Second)
	if got := sha(t, path); got != sum {
		t.Fatal("data changed after remount")
	}
	writeAt(t, path, 8*mib, mib, 13)
	if err := v.Clone(context.Background(), VMDisk("box"), VMDisk("box2")); err != nil {
		t.Fatalf("clone after remount: %v", err)
	}
}

func TestSupervisorRemountsHungMount(t *testing.T) {
	needIntegration(t)
	v := openVolume(t, Config{StateDir: t.TempDir()})
	fastSupervision(v)
	events, unsubscribe := v.Subscribe()
	defer unsubscribe()
	path, sum := diskWithData(t, v, "box")

	svc, _, err := v.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	// A stopped service process leaves the mount hanging, not failing.
	if err := syscall.Kill(svc, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(svc, syscall.SIGKILL)
	e := waitEvent(t, events, EventLost, 20*time.Second)
	if !strings.Contains(e.Err.Error(), "not answering") {
		t.Fatalf("lost event: %v", e.Err)
	}
	waitEvent(t, events, EventRemounted, 60*time.Second)
	if got := sha(t, path); got != sum {
		t.Fatal("data changed after a hung mount was replaced")
	}
	if _, err := os.Stat("/proc/" + itoa(svc) + "/status"); err == nil {
		b, _ := os.ReadFile("/proc/" + itoa(svc) + "/status")
		if !strings.Contains(string(b), "zombie") {
			t.Fatalf("the hung service process %d is still alive", svc)
		}
	}
}

// TestMinIOOutage: with MinIO down, a volume that needs it fails to open
// with a clear message; a mounted volume's writes wait and land once MinIO
// is back, and nothing written before or during is lost.
func TestMinIOOutage(t *testing.T) {
	needIntegration(t)
	m := startMinIO(t)
	cfg := Config{
		StateDir: t.TempDir(),
		S3:       &S3Config{Endpoint: m.Endpoint(), Bucket: "den-vol", CreateBucket: true},
		Secrets:  Secrets{AccessKey: m.user, SecretKey: m.password},
	}
	v := openVolume(t, cfg)
	path, _ := diskWithData(t, v, "box")

	m.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := cfg
	other.StateDir = t.TempDir()
	other.JuiceFS = v.bin
	if _, err := Open(ctx, other); err == nil || !strings.Contains(err.Error(), "endpoint unreachable") {
		t.Fatalf("open with MinIO down: got %v, want an 'endpoint unreachable' error", err)
	} else {
		t.Logf("open with MinIO down: %v", err)
	}

	// A write during the outage, fsynced: it waits for the upload. It is
	// done by a child process (dd): a FUSE file open in this process would
	// be inherited by the fork that restarts MinIO, whose exec closes it,
	// and close on FUSE is a FLUSH that waits for the very upload that
	// needs MinIO (see the package doc).
	src := filepath.Join(t.TempDir(), "pattern")
	if err := os.WriteFile(src, pattern(2*mib, 21), 0o600); err != nil {
		t.Fatal(err)
	}
	dd := exec.Command("dd", "if="+src, "of="+path, "bs=1M", "seek=20", "count=2", "conv=notrunc,fsync", "status=none")
	done := make(chan error, 1)
	wstart := time.Now()
	go func() {
		out, err := dd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		done <- err
	}()
	time.Sleep(3 * time.Second)
	m.Start()
	select {
	case err := <-done:
		if err != nil {
			dumpLog(t, v.logPath)
			t.Fatalf("write during the outage: %v", err)
		}
		t.Logf("the write during the outage landed after %s", time.Since(wstart).Round(time.Millisecond))
	case <-time.After(90 * time.Second):
		dumpLog(t, v.logPath)
		t.Fatal("fsync did not return within 90s of MinIO coming back")
	}
	want := sha(t, path)

	// Read everything back from MinIO through a fresh cache.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := v.Unmount(ctx2); err != nil {
		t.Fatal(err)
	}
	cfg.CacheDir = t.TempDir()
	v2 := openVolume(t, cfg)
	p2, _ := v2.Path(VMDisk("box"))
	if got := sha(t, p2); got != want {
		t.Fatal("data read back from MinIO differs")
	}
}

// TestPreflightMessages: wrong settings fail Open with one actionable line
// and leave nothing mounted.
func TestPreflightMessages(t *testing.T) {
	needIntegration(t)
	m := startMinIO(t)
	jfs := tool(t, "juicefs", "DEN_JUICEFS")
	dead := "http://127.0.0.1:" + itoa(freePort(t))
	cases := []struct {
		name     string
		endpoint string
		bucket   string
		create   bool
		sec      Secrets
		want     string
	}{
		{"bad secret key", m.Endpoint(), "bkt-1", true, Secrets{AccessKey: m.user, SecretKey: "wrong-secret-key"}, "secret key rejected"},
		{"bad access key", m.Endpoint(), "bkt-1", true, Secrets{AccessKey: "nobody", SecretKey: m.password}, "access key rejected"},
		{"missing bucket", m.Endpoint(), "no-such-bucket", false, Secrets{AccessKey: m.user, SecretKey: m.password}, `bucket "no-such-bucket" does not exist`},
		{"nothing listening", dead, "bkt-1", true, Secrets{AccessKey: m.user, SecretKey: m.password}, "endpoint unreachable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{
				StateDir: t.TempDir(),
				JuiceFS:  jfs,
				S3:       &S3Config{Endpoint: c.endpoint, Bucket: c.bucket, CreateBucket: c.create},
				Secrets:  c.sec,
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			v, err := Open(ctx, cfg)
			if err == nil {
				cleanupVolume(t, v)
				t.Fatal("open succeeded")
			}
			t.Logf("%s (%s)", err, time.Since(start).Round(time.Millisecond))
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %q, want one line with %q", err, c.want)
			}
			if _, ok, _ := findMount(cfg.StateDir + "/mnt"); ok {
				t.Fatal("a failed open left a mount")
			}
		})
	}
}

func dumpLog(t *testing.T, path string) {
	b, _ := os.ReadFile(path)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	t.Logf("%s:\n%s", path, b)
}
