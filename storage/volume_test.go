package storage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/pgtest"
	"github.com/denhq/den/internal/poll"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/internal/testutil"
)

const (
	testDiskSize = 256 << 20
	mib          = 1 << 20
)

// exercise runs the clone contract on an open volume: a disk image with
// data, a clone, writes to the clone, the source untouched, before and
// after a remount (reopen returns the remounted volume).
func exercise(t *testing.T, v Volume, reopen func() Volume) {
	ctx := context.Background()
	disk := VMDisk("box")
	cp := CheckpointFile("box", "cp-1", "disk")
	if err := v.CreateDisk(ctx, disk, testDiskSize); err != nil {
		t.Fatal(err)
	}
	if err := v.CreateDisk(ctx, disk, testDiskSize); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("create over an existing disk: got %v, want ErrExist", err)
	}
	src, _ := v.Path(disk)
	writeAt(t, src, 0, 4*mib, 1)
	writeAt(t, src, 100*mib, 4*mib, 2)
	writeAt(t, src, testDiskSize-mib, mib, 3)
	srcSum := sha(t, src)
	checkDataRanges(t, v)

	start := time.Now()
	if err := v.Clone(ctx, disk, cp); err != nil {
		t.Fatal(err)
	}
	t.Logf("clone of a %d MiB disk with 9 MiB of data: %s", testDiskSize/mib, time.Since(start))
	if err := v.Clone(ctx, disk, cp); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("clone onto an existing file: got %v, want ErrExist", err)
	}
	dst, _ := v.Path(cp)
	if got := sha(t, dst); got != srcSum {
		t.Fatalf("clone differs from its source")
	}
	writeAt(t, dst, 0, mib, 9)
	writeAt(t, dst, 200*mib, mib, 9)
	cloneSum := sha(t, dst)
	if cloneSum == srcSum {
		t.Fatal("writes to the clone did not change it")
	}
	if got := sha(t, src); got != srcSum {
		t.Fatal("writes to the clone changed the source")
	}
	u, err := v.Usage(ctx, disk)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("usage of the disk: %+v", u)
	if u.Logical != testDiskSize || u.Files != 1 || u.Data < 9*mib || u.Data > 16*mib {
		t.Fatalf("usage %+v: want logical %d and about 9 MiB of data", u, testDiskSize)
	}
	// A directory clone (a whole checkpoint) and an atomic replace (restore).
	if err := v.Clone(ctx, CheckpointDir("box", "cp-1"), CheckpointDir("box2", "cp-1")); err != nil {
		t.Fatal(err)
	}
	if err := v.CloneOver(ctx, cp, disk); err != nil {
		t.Fatal(err)
	}
	if got := sha(t, src); got != cloneSum {
		t.Fatal("CloneOver did not put the clone's content in place")
	}
	if err := v.Rename(ctx, VMDir("box2"), VMDir("box3")); err != nil {
		t.Fatal(err)
	}
	if err := v.Clone(ctx, disk, Path("../escape")); err == nil {
		t.Fatal("a path out of the volume was accepted")
	}
	if err := v.Health(ctx); err != nil {
		t.Fatal(err)
	}

	v = reopen()
	src, _ = v.Path(disk)
	dst, _ = v.Path(cp)
	moved, _ := v.Path(CheckpointFile("box3", "cp-1", "disk"))
	if got := sha(t, src); got != cloneSum {
		t.Fatal("after remount: the disk changed")
	}
	if got := sha(t, dst); got != cloneSum {
		t.Fatal("after remount: the clone changed")
	}
	if got := sha(t, moved); got != cloneSum {
		t.Fatal("after remount: the cloned checkpoint directory changed")
	}
	if err := v.Remove(ctx, VMDir("box3")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(moved); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("remove left %s: %v", moved, err)
	}
}

func TestEmbeddedVolume(t *testing.T) {
	needIntegration(t)
	cfg := Config{StateDir: t.TempDir()}
	v := openVolume(t, cfg)
	if v.cfg.Shape() != Embedded {
		t.Fatalf("shape %s", v.cfg.Shape())
	}
	exercise(t, v, func() Volume {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := v.Unmount(ctx); err != nil {
			t.Fatal(err)
		}
		return openVolume(t, cfg)
	})
}

func TestMinIOVolume(t *testing.T) {
	needIntegration(t)
	m := startMinIO(t)
	cfg := Config{
		StateDir: t.TempDir(),
		S3:       &S3Config{Endpoint: m.Endpoint(), Bucket: "den-vol", CreateBucket: true},
		Secrets:  Secrets{AccessKey: m.user, SecretKey: m.password},
	}
	v := openVolume(t, cfg)
	exercise(t, v, func() Volume {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := v.Unmount(ctx); err != nil {
			t.Fatal(err)
		}
		// A fresh cache: what is read back comes from MinIO.
		cfg.CacheDir = t.TempDir()
		return openVolume(t, cfg)
	})
}

// TestSharedVolume is the scale-out shape: data in MinIO, metadata in
// PostgreSQL with its password passed through the environment, mounted by
// two "hosts" (two mounts) at once.
// sharedConfig is the config of a volume that keeps its metadata in a
// PostgreSQL server and its data in a MinIO server, both started here.
func sharedConfig(t *testing.T) (Config, *minioServer, *pgtest.Server) {
	t.Helper()
	m := startMinIO(t)
	pg := pgtest.Start(t)
	secrets := t.TempDir() + "/secrets.json"
	if err := os.WriteFile(secrets, []byte(`{"access_key":"`+m.user+`","secret_key":"`+m.password+`","meta_password":"`+pgtest.Password+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := t.TempDir() + "/storage.json"
	if err := os.WriteFile(conf, []byte(`{"state_dir":"a","meta_url":"`+pg.URL+`","secrets_file":"`+secrets+`",
		"s3":{"endpoint":"`+m.Endpoint()+`","bucket":"den-shared","create_bucket":true}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, m, pg
}

func TestSharedVolume(t *testing.T) {
	needIntegration(t)
	cfg, m, _ := sharedConfig(t)
	a := openVolume(t, cfg)
	// The password reached juicefs, and not through its command line.
	svc, sup, err := a.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{svc, sup} {
		b, _ := os.ReadFile("/proc/" + itoa(pid) + "/cmdline")
		for _, secret := range []string{pgtest.Password, m.password} {
			if containsBytes(b, secret) {
				t.Fatalf("a secret is on the command line of pid %d: %q", pid, b)
			}
		}
	}
	cfgB := cfg
	cfgB.StateDir = t.TempDir()
	cfgB.MountPoint, cfgB.CacheDir = "", ""
	b := openVolume(t, cfgB)

	ctx := context.Background()
	if err := a.CreateDisk(ctx, VMDisk("box"), 64*mib); err != nil {
		t.Fatal(err)
	}
	pa, _ := a.Path(VMDisk("box"))
	writeAt(t, pa, 10*mib, 2*mib, 5)
	if err := a.Clone(ctx, VMDisk("box"), CheckpointFile("box", "cp-1", "disk")); err != nil {
		t.Fatal(err)
	}
	// The other host sees the clone with the same content (attribute
	// caches last a second).
	pb, _ := b.Path(CheckpointFile("box", "cp-1", "disk"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(pb); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the clone did not appear on the second mount")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sha(t, pb) != sha(t, pa) {
		t.Fatal("the second mount reads different data")
	}
}

// TestSharedVolumeAcrossPostgresRestart: a disk kept open and written by
// another process, as a VMM does, goes on through a restart and a crash
// of the PostgreSQL server that holds the volume's metadata. A flush that
// runs while the server is down waits for it, and what was written is
// there on another mount afterwards. (JuiceFS as released fails that flush, and
// every later write and flush of the file: bin/juicefs is built with
// tools/juicefs/patch.)
func TestSharedVolumeAcrossPostgresRestart(t *testing.T) {
	needIntegration(t)
	cfg, _, pg := sharedConfig(t)
	a := openVolume(t, cfg)
	ctx := context.Background()
	if err := a.CreateDisk(ctx, VMDisk("box"), 64*mib); err != nil {
		t.Fatal(err)
	}
	path, _ := a.Path(VMDisk("box"))

	w := startDiskWriter(t, path)
	// waitFor waits until cond holds of the flushes done, failing on a
	// write or flush that failed.
	waitFor := func(what string, cond func(flushes int) bool) {
		t.Helper()
		var n int
		var err error
		done := poll.Until(2*time.Minute, func() bool {
			n, err = w.state()
			return err != nil || cond(n)
		})
		if err != nil {
			t.Fatalf("%s: %v\njuicefs: %s", what, err, a.logTail(6))
		}
		if !done {
			t.Fatalf("%s: not within 2m (%d flushes done)", what, n)
		}
	}
	// A restart (a fast shutdown: connections terminated), then a crash
	// (an immediate shutdown: connections cut, then crash recovery).
	for _, stop := range []struct {
		name string
		down func()
	}{{"restart", pg.Down}, {"crash", pg.Crash}} {
		waitFor("writes before the "+stop.name, func(n int) bool { return n >= 8 })
		stop.down()
		up := false
		t.Cleanup(func() {
			if !up {
				_ = pg.Up() // a failed test's writer and mount wait for it
			}
		})
		// JuiceFS counts the metadata transactions it runs again: the
		// writer's next flush runs one while the server is away.
		retried := txRestarts(t, a.Root())
		waitFor("a flush waiting through the "+stop.name, func(int) bool { return txRestarts(t, a.Root()) > retried })
		if err := pg.Up(); err != nil {
			t.Fatal(err)
		}
		up = true
		n, _ := w.state()
		waitFor("writes after the "+stop.name, func(k int) bool { return k >= n+8 })
	}
	n, err := w.stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes, each flushed, through a restart and a crash of PostgreSQL", n)

	// Another host's mount reads what was written.
	cfgB := cfg
	cfgB.StateDir = t.TempDir()
	cfgB.MountPoint, cfgB.CacheDir = "", ""
	b := openVolume(t, cfgB)
	pb, _ := b.Path(VMDisk("box"))
	want := writerContent(n)
	got := make([]byte, len(want))
	f, err := os.Open(pb)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the other mount reads other data than was written across the restart")
	}
}

// The disk writer: a process of its own that writes slots of a file in
// turn, each write flushed, and says so a line each ("ok N", or "error
// ..." and exits); it stops when its standard input closes, saying "done
// N". The test must not hold the file open itself: a process it forks
// meanwhile (PostgreSQL) would close it at exec, and a close of a JuiceFS
// file waits for its flush.
const writerSlot, writerSlots = 256 << 10, 16

// writerContent is what the file's slots hold after n writes.
func writerContent(n int) []byte {
	b := make([]byte, writerSlot*writerSlots)
	for i := max(0, n-writerSlots); i < n; i++ {
		copy(b[(i%writerSlots)*writerSlot:], pattern(writerSlot, byte(i)))
	}
	return b
}

type diskWriter struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	n     int
	err   error
	done  chan struct{}
}

func startDiskWriter(t *testing.T, path string) *diskWriter {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDiskWriterProcess$")
	cmd.Env = append(os.Environ(), "DEN_TEST_DISK_WRITER="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &diskWriter{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			if k, ok := strings.CutPrefix(line, "ok "); ok {
				w.n, _ = strconv.Atoi(k)
			} else if k, ok := strings.CutPrefix(line, "done "); ok {
				w.n, _ = strconv.Atoi(k)
			} else if msg, ok := strings.CutPrefix(line, "error "); ok {
				w.err = errors.New(msg)
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-w.done
		_ = cmd.Wait()
	})
	return w
}

// state is how many writes were flushed, and the writer's error.
func (w *diskWriter) state() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.err
}

// stop ends the writer, and says how many writes it made and how the
// last one failed, if it did.
func (w *diskWriter) stop() (int, error) {
	w.stdin.Close()
	<-w.done
	return w.state()
}

// TestDiskWriterProcess is the disk writer, when the environment names a
// file (DEN_TEST_DISK_WRITER).
func TestDiskWriterProcess(t *testing.T) {
	path := os.Getenv("DEN_TEST_DISK_WRITER")
	if path == "" {
		t.Skip("the disk writer of TestSharedVolumeAcrossPostgresRestart (a process of its own)")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	for i := 0; ; i++ {
		select {
		case <-stop:
			fmt.Println("done", i)
			os.Exit(0)
		default:
		}
		_, err := f.WriteAt(pattern(writerSlot, byte(i)), int64((i%writerSlots)*writerSlot))
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			fmt.Printf("error write %d: %v\n", i, err)
			os.Exit(1)
		}
		fmt.Println("ok", i+1)
	}
}

// txRestarts is how many metadata transactions the JuiceFS mount at root
// has run again.
func txRestarts(t *testing.T, root string) float64 {
	t.Helper()
	n, err := testutil.JuiceFSRetries(root)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAdoptAfterDaemonRestart: a daemon that stops (Close) leaves the mount
// serving; the next one adopts it without remounting, and still supervises
// it although the juicefs processes are not its children.
func TestAdoptAfterDaemonRestart(t *testing.T) {
	needIntegration(t)
	cfg := Config{StateDir: t.TempDir()}
	v := openVolume(t, cfg)
	path, sum := diskWithData(t, v, "box")
	f, err := os.Open(path) // a running VM holds its disk open
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	svc, sup, err := v.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	v.Close()

	v2 := openVolume(t, cfg)
	svc2, sup2, err := v2.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	if svc2 != svc || sup2 != sup {
		t.Fatalf("remounted (pids %d/%d -> %d/%d) instead of adopting", svc, sup, svc2, sup2)
	}
	if got := sha(t, path); got != sum {
		t.Fatal("data changed across the daemon restart")
	}
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatalf("a file opened before the restart: %v", err)
	}

	fastSupervision(v2)
	events, unsubscribe := v2.Subscribe()
	defer unsubscribe()
	syscall.Kill(sup, syscall.SIGKILL)
	syscall.Kill(svc, syscall.SIGKILL)
	waitEvent(t, events, EventLost, 20*time.Second)
	waitEvent(t, events, EventRemounted, 60*time.Second)
	if got := sha(t, path); got != sum {
		t.Fatal("data changed after the adopted mount was replaced")
	}

	// A daemon that finds a dead mount (its processes killed while no
	// daemon ran) replaces it.
	svc, sup, err = v2.MountPIDs()
	if err != nil {
		t.Fatal(err)
	}
	v2.Close()
	syscall.Kill(sup, syscall.SIGKILL)
	syscall.Kill(svc, syscall.SIGKILL)
	v3 := openVolume(t, cfg)
	if svc3, _, err := v3.MountPIDs(); err != nil || svc3 == svc {
		t.Fatalf("dead mount not replaced: %v", err)
	}
	if got := sha(t, path); got != sum {
		t.Fatal("data changed after a dead mount was replaced at open")
	}
}

// TestCloneThroughControlFile checks that clones and usage go through the
// mount's control file, not the juicefs binary (which is made unrunnable
// here), and that the client's errors come back as errors.
func TestCloneThroughControlFile(t *testing.T) {
	v, disk, src := volumeWithDisk(t)
	ctx := context.Background()
	if err := os.Chmod(src, 0o640); err != nil {
		t.Fatal(err)
	}
	bin := v.bin
	v.bin = "/nonexistent/juicefs"
	defer func() { v.bin = bin }()
	cp := CheckpointFile("box", "cp-1", "disk")
	if err := v.Clone(ctx, disk, cp); err != nil {
		t.Fatalf("clone without the juicefs binary: %v", err)
	}
	dst, _ := v.Path(cp)
	if sha(t, dst) != sha(t, src) {
		t.Fatal("the clone differs from its source")
	}
	if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("the clone's mode: %v %v, want 0640 kept", st.Mode(), err)
	}
	// Usage is asked there too, and agrees with `juicefs info --raw`.
	u, err := v.Usage(ctx, CheckpointDir("box", "cp-1"))
	if err != nil {
		t.Fatalf("usage without the juicefs binary: %v", err)
	}
	v.bin = bin
	cli, err := v.dataBytesCLI(ctx, []string{dst})
	if err != nil {
		t.Fatal(err)
	}
	v.bin = "/nonexistent/juicefs"
	if u.Data != cli || u.Data < mib || u.Files != 1 || u.Logical != testDiskSize {
		t.Fatalf("usage %+v, juicefs info says %d bytes of data: want the same, at least 1 MiB", u, cli)
	}
	// The client answers errors: an existing name, a missing source.
	if err := ControlClone(ctx, v.Root(), src, dst); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("clone onto an existing name: got %v, want EEXIST", err)
	}
	missing := filepath.Join(filepath.Dir(src), "missing")
	if err := ControlClone(ctx, v.Root(), missing, dst+"2"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("clone of a missing file: got %v, want not exist", err)
	}
	// Not a JuiceFS mount: the caller is told to use the binary.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ControlClone(ctx, dir, filepath.Join(dir, "f"), filepath.Join(dir, "g")); !errors.Is(err, errNoControl) {
		t.Fatalf("clone outside juicefs: got %v, want errNoControl", err)
	}
}

// volumeWithDisk opens a volume with a VM disk holding 1 MiB of data:
// its volume path and host path.
func volumeWithDisk(t *testing.T) (*JuiceFS, Path, string) {
	t.Helper()
	needIntegration(t)
	v := openVolume(t, Config{StateDir: t.TempDir()})
	disk := VMDisk("box")
	if err := v.CreateDisk(context.Background(), disk, testDiskSize); err != nil {
		t.Fatal(err)
	}
	src, _ := v.Path(disk)
	writeAt(t, src, mib, mib, 7)
	return v, disk, src
}

// TestCloneWhileForking clones while the process forks: a fork copies
// every descriptor, and the copy's close at exec flushes the control file,
// which makes JuiceFS cancel the request in flight (EINTR). The daemon
// starts VMMs and helpers while other VMs are being created.
func TestCloneWhileForking(t *testing.T) {
	v, disk, _ := volumeWithDisk(t)
	ctx := context.Background()
	stop := make(chan struct{})
	forked := make(chan int, 2)
	for range 2 {
		go func() {
			n := 0
			defer func() { forked <- n }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := exec.Command("true").Run(); err != nil {
					t.Error(err)
					return
				}
				n++
			}
		}()
	}
	for i := range 40 {
		if err := v.Clone(ctx, disk, CheckpointFile("box", fmt.Sprintf("cp-%d", i), "disk")); err != nil {
			close(stop)
			t.Fatalf("clone %d while forking: %v", i, err)
		}
	}
	close(stop)
	t.Logf("40 clones beside %d forks", <-forked+<-forked)
}

// checkDataRanges: a file's data ranges, as the volume maps them, are
// where it was written, across a chunk boundary (64 MiB) too, in a clone
// with writes of its own, and after a hole was punched.
func checkDataRanges(t *testing.T, v Volume) {
	t.Helper()
	ctx := context.Background()
	f, c := VMDir("ranges").Join("file"), VMDir("ranges").Join("clone")
	if err := v.CreateDisk(ctx, f, testDiskSize); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = v.Remove(ctx, VMDir("ranges")) }()
	want := func(p Path, ext []sparse.Extent) {
		t.Helper()
		got, err := v.DataRanges(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, ext) {
			t.Errorf("data ranges of %s: %v, want %v", p, got, ext)
		}
	}
	want(f, nil)
	hf, _ := v.Path(f)
	writeAt(t, hf, 0, 4096, 1)
	writeAt(t, hf, 63*mib, 2*mib, 2)
	writeAt(t, hf, 130*mib, mib, 3)
	want(f, []sparse.Extent{{Off: 0, Len: 4096}, {Off: 63 * mib, Len: 2 * mib}, {Off: 130 * mib, Len: mib}})
	if err := v.Clone(ctx, f, c); err != nil {
		t.Fatal(err)
	}
	hc, _ := v.Path(c)
	writeAt(t, hc, 130*mib+mib/2, mib, 4)
	writeAt(t, hc, 200*mib, mib, 5)
	want(c, []sparse.Extent{{Off: 0, Len: 4096}, {Off: 63 * mib, Len: 2 * mib}, {Off: 130 * mib, Len: mib + mib/2}, {Off: 200 * mib, Len: mib}})
	want(f, []sparse.Extent{{Off: 0, Len: 4096}, {Off: 63 * mib, Len: 2 * mib}, {Off: 130 * mib, Len: mib}})
	fd, err := os.OpenFile(hc, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = syscall.Fallocate(int(fd.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 63*mib, 2*mib)
	fd.Close()
	if err != nil {
		t.Fatalf("punch a hole: %v", err)
	}
	want(c, []sparse.Extent{{Off: 0, Len: 4096}, {Off: 130 * mib, Len: mib + mib/2}, {Off: 200 * mib, Len: mib}})
}
