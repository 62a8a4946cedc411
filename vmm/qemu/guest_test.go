package qemu_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/cgroup"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// guestEnv is what a real-guest test needs: images, a writable copy of
// the minimal root disk, and the host key the agent accepts.
type guestEnv struct {
	images image.Dir
	disk   string
	signer ssh.Signer
	dir    string
}

func TestMain(m *testing.M) {
	vmm.RunShim() // this test binary launches the confined QEMUs on cgroup v1
	os.Exit(m.Run())
}

func newGuestEnv(t testing.TB) *guestEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("real guest test: boots QEMU (run without -short)")
	}
	testutil.NeedRoot(t, "real guest test")
	if _, err := qemu.FindBinary(); err != nil {
		t.Fatal(err)
	}
	images, err := image.DefaultDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := images.Check(image.Minimal); err != nil {
		t.Fatalf("guest images not built (make image): %v", err)
	}
	// Short paths: unix sockets live in the run dirs.
	dir, err := os.MkdirTemp("/tmp", "qg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil { // the VMM's user goes through to its run dir
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "disk.raw")
	if err := sparse.Copy(images.RootDisk(image.Minimal), disk); err != nil {
		t.Fatal(err)
	}
	_, signer, err := agent.NewEd25519Key("test")
	if err != nil {
		t.Fatal(err)
	}
	return &guestEnv{images: images, disk: disk, signer: signer, dir: dir}
}

// confine is a VMM's confinement for a test: user nobody and a cgroup
// named after the test, removed at cleanup.
func confine(t testing.TB, name string) vmm.Confine {
	t.Helper()
	u, err := vmm.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	g, err := h.Create(fmt.Sprintf("qemutest-%d-%s", os.Getpid(), name), cgroup.Limits{MemoryMax: 1 << 30, PidsMax: 256, CPUQuota: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Remove(ctx); err != nil {
			t.Error(err)
		}
	})
	return vmm.Confine{User: u, Cgroup: g}
}

func (e *guestEnv) config() vmm.Config {
	return vmm.Config{
		CPUs: 1, MemoryBytes: 256 << 20,
		Kernel: e.images.BzImage(), Initramfs: e.images.Initramfs(),
		Cmdline: "console=ttyS0 panic=-1 " + agent.AuthorizedKeyArg(e.signer.PublicKey()) + " den.hostname=guest",
		Disks:   []vmm.Disk{{ID: "root", Path: e.disk}},
		Net:     []vmm.Net{{ID: "net0"}},
	}
}

// newVMM returns a driver in a fresh run dir, shut down at cleanup,
// confined as den confines QEMU: an unprivileged user (nobody here), a
// cgroup of its own, the sandbox.
func (e *guestEnv) newVMM(t testing.TB, name string) *qemu.VMM {
	v := qemu.New(qemu.Options{RunDir: vmm.RunDir(filepath.Join(e.dir, name)), Confine: confine(t, name)})
	if err := v.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Shutdown(context.Background()) })
	return v
}

// boot creates and boots a VM and returns its agent client.
func (e *guestEnv) boot(t testing.TB, v *qemu.VMM) *agent.Client {
	t.Helper()
	ctx := context.Background()
	if err := v.Create(ctx, e.config()); err != nil {
		t.Fatal(err)
	}
	if err := v.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	return e.connect(t, v)
}

func (e *guestEnv) connect(t testing.TB, v *qemu.VMM) *agent.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := agent.WaitReady(ctx, func(ctx context.Context) (net.Conn, error) {
		return v.DialGuest(ctx, agent.Port)
	}, e.signer)
	if err != nil {
		t.Fatalf("agent: %v\nconsole: %s", err, vmm.TailFile(filepath.Join(e.dir, "console.log"), 2000))
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// snapshot pauses v's VM and snapshots it into the env's dir "snap".
func (e *guestEnv) snapshot(t testing.TB, v *qemu.VMM) string {
	t.Helper()
	ctx := context.Background()
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(e.dir, "snap")
	if err := os.Mkdir(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// run runs a shell command line in the guest and returns its stdout.
func run(t testing.TB, c *agent.Client, line string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, err := c.Exec(ctx, agent.ExecRequest{CmdLine: line, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v (stderr %q)", line, err, errb.String())
	}
	return out.String(), code
}

func TestGuestExecSFTPAndForward(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	c := e.boot(t, v)

	if out, code := run(t, c, "uname -a"); code != 0 || !strings.HasPrefix(out, "Linux guest ") {
		t.Fatalf("uname -a: %q (exit %d)", out, code)
	}
	if _, code := run(t, c, "ls /nonexistent"); code == 0 {
		t.Fatal("ls of a missing file exited 0")
	}
	if _, code := run(t, c, "exit 42"); code != 42 {
		t.Fatalf("exit 42 gave %d", code)
	}

	// sftp: a file in and back out, checked by checksum.
	sc, err := c.SFTP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	f, err := sc.Create("/root/blob")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := fmt.Sprintf("%x", sha256.Sum256(data))
	if out, _ := run(t, c, "sha256sum /root/blob"); !strings.HasPrefix(out, want) {
		t.Fatalf("guest checksum %q, want %s", out, want)
	}
	run(t, c, "cp /root/blob /root/blob2")
	g, err := sc.Open("/root/blob2")
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(g)
	g.Close()
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("sftp get: %d bytes, err %v", len(back), err)
	}

	// A forwarded port reaches a server inside the guest.
	run(t, c, "mkdir -p /tmp/www && echo served-from-guest > /tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www")
	var body string
	for i := 0; i < 50; i++ {
		body, err = httpGet(c, "127.0.0.1:8080")
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(body, "served-from-guest") {
		t.Fatalf("forwarded GET: %q, %v", body, err)
	}
}

func httpGet(c *agent.Client, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := c.DialTCP(ctx, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	io.WriteString(conn, "GET /index.html HTTP/1.0\r\nHost: guest\r\n\r\n")
	b, err := io.ReadAll(bufio.NewReader(conn))
	return string(b), err
}

func TestGuestSnapshotRestore(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	c := e.boot(t, v)
	ctx := context.Background()

	// A process and a file that live only in memory (tmpfs).
	run(t, c, "echo in-memory > /tmp/note; sleep 100000 & echo $! > /tmp/pid")
	pid, _ := run(t, c, "cat /tmp/pid")
	c.Close() // the guest channel does not survive a restore: redial after

	snap := e.snapshot(t, v)
	if err := v.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the restored guest's clock is now stale

	w := e.newVMM(t, "b")
	if err := w.Restore(ctx, snap, vmm.RestoreOptions{Resume: true}); err != nil {
		t.Fatal(err)
	}
	if info, err := w.Info(ctx); err != nil || info.State != vmm.StateRunning {
		t.Fatalf("restored vm: %+v %v", info, err)
	}
	c2 := e.connect(t, w)
	if out, code := run(t, c2, "cat /tmp/note; kill -0 $(cat /tmp/pid) && echo alive"); code != 0 || out != "in-memory\nalive\n" {
		t.Fatalf("after restore: %q (exit %d); pid was %s", out, code, pid)
	}
	reply, err := c2.SetClock(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if reply.Step < 2*time.Second {
		t.Fatalf("clock step %v: the restored guest should have been >= 2s behind", reply.Step)
	}
	out, _ := run(t, c2, "date +%s")
	guest, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if d := time.Now().Unix() - guest; d < -2 || d > 2 {
		t.Fatalf("guest clock off by %ds after set", d)
	}
	c2.Close()
	if err := w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// The memory staged in a RAM file (as a den restore does while it
	// verifies and stops the VM) is mapped by the new QEMU as it is
	// filled, then moved to the VMM's own RAM file; a staged file of
	// another size is refused.
	staged := filepath.Join(e.dir, "staged", "memory")
	wait, err := qemu.StageMemory(snap, "", staged, nil)
	if err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(e.dir, "staged", "short")
	if err := os.WriteFile(short, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.newVMM(t, "c").Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: short, WaitStaged: wait}); err == nil || !strings.Contains(err.Error(), "staged RAM file") {
		t.Fatalf("restore with a staged RAM file of 0 bytes: %v", err)
	}
	x := e.newVMM(t, "d")
	if err := x.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: staged, WaitStaged: wait}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staged); !os.IsNotExist(err) {
		t.Fatalf("the staged RAM file is still there after the restore took it: %v", err)
	}
	if st, err := os.Stat(vmm.RunDir(filepath.Join(e.dir, "d")).MemoryFile()); err != nil || st.Size() == 0 {
		t.Fatalf("the VMM's RAM file after a restore from staged memory: %v %v", st, err)
	}
	c3 := e.connect(t, x)
	if out, code := run(t, c3, "cat /tmp/note; kill -0 $(cat /tmp/pid) && echo alive"); code != 0 || out != "in-memory\nalive\n" {
		t.Fatalf("after a restore from staged memory: %q (exit %d)", out, code)
	}
	c3.Close()
	if err := x.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// A staging that failed: the driver makes its copy in the file.
	wait, err = qemu.StageMemory(snap, "", staged, nil)
	if err != nil {
		t.Fatal(err)
	}
	failed := func() error {
		_ = wait() // no other writer while the driver copies
		return errors.New("the staging failed")
	}
	y := e.newVMM(t, "e")
	if err := y.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: staged, WaitStaged: failed}); err != nil {
		t.Fatal(err)
	}
	c4 := e.connect(t, y)
	if out, code := run(t, c4, "cat /tmp/note; kill -0 $(cat /tmp/pid) && echo alive"); code != 0 || out != "in-memory\nalive\n" {
		t.Fatalf("after a restore whose staging failed: %q (exit %d)", out, code)
	}
}

func TestGuestBadInput(t *testing.T) {
	e := newGuestEnv(t)
	ctx := context.Background()

	t.Run("missing kernel", func(t *testing.T) {
		v := e.newVMM(t, "k")
		cfg := e.config()
		cfg.Kernel = filepath.Join(e.dir, "no-such-kernel")
		err := v.Create(ctx, cfg)
		if err == nil || !strings.Contains(err.Error(), "no-such-kernel") {
			t.Fatalf("create with a missing kernel: %v", err)
		}
		if v.PID() != 0 {
			t.Fatalf("a vmm process was started: %d", v.PID())
		}
	})

	t.Run("corrupt image", func(t *testing.T) {
		bad := filepath.Join(e.dir, "bad.raw")
		junk := make([]byte, 8<<20)
		rand.Read(junk)
		os.WriteFile(bad, junk, 0o600)
		v := e.newVMM(t, "c")
		cfg := e.config()
		cfg.Disks[0].Path = bad
		if err := v.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if err := v.Boot(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-v.Exited():
		case <-time.After(2 * time.Minute):
			t.Fatal("vm with a corrupt disk still runs after 2 min")
		}
		console, _ := os.ReadFile(filepath.Join(e.dir, "c", "console.log"))
		if !bytes.Contains(console, []byte(image.FatalMarker)) {
			t.Fatalf("console lacks %q:\n%s", image.FatalMarker, console)
		}
	})

	t.Run("vmm killed mid-boot", func(t *testing.T) {
		v := e.newVMM(t, "m")
		if err := v.Create(ctx, e.config()); err != nil {
			t.Fatal(err)
		}
		if err := v.Boot(ctx); err != nil {
			t.Fatal(err)
		}
		pid := v.PID()
		syscall.Kill(pid, syscall.SIGKILL)
		select {
		case <-v.Exited():
		case <-time.After(10 * time.Second):
			t.Fatal("exit not noticed")
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := v.DialGuest(dctx, agent.Port); !errors.Is(err, vmm.ErrNotRunning) {
			t.Fatalf("dial after kill: %v", err)
		}
		if info, err := v.Info(ctx); err != nil || info.State != vmm.StateShutdown {
			t.Fatalf("info after kill: %+v %v", info, err)
		}
		if err := v.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if syscall.Kill(pid, 0) == nil {
			t.Fatalf("process %d left running", pid)
		}
	})
}

// TestGuestPrelaunchedRestore: a QEMU prelaunched beside the VM's running
// one (its RAM the staged memory, its disk a staged copy opened before
// it is renamed into place) takes over once the old one is killed, in
// the runtime dir it is moved to, with the guest's memory and the disk of
// the snapshot; a restore that stages other memory is refused.
func TestGuestPrelaunchedRestore(t *testing.T) {
	e := newGuestEnv(t)
	v := e.newVMM(t, "a")
	c := e.boot(t, v)
	ctx := context.Background()
	run(t, c, "echo in-memory > /tmp/note; echo on-disk > /root/mark; sync")
	snap := e.snapshot(t, v)
	stagedDisk := filepath.Join(e.dir, "disk-restoring")
	if err := sparse.Copy(e.disk, stagedDisk); err != nil {
		t.Fatal(err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// The old guest runs on and changes both (the file in place, in the
	// blocks the snapshot's memory points at).
	run(t, c, "echo changed > /tmp/note; printf 'changed\\n' | dd of=/root/mark conv=notrunc 2>/dev/null; sync")
	c.Close()

	staged := filepath.Join(e.dir, "staged", "memory")
	wait, err := qemu.StageMemory(snap, "", staged, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := e.newVMM(t, "b")
	if err := w.Prelaunch(ctx, e.config(), vmm.Prelaunch{Memory: staged, DiskFiles: []string{stagedDisk}, Pred: v}); err != nil {
		t.Fatal(err)
	}
	if err := w.Prelaunch(ctx, e.config(), vmm.Prelaunch{Memory: staged}); err == nil {
		t.Fatal("a second prelaunch of the same VMM succeeded")
	}
	if err := v.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.Exited():
	default:
		t.Fatal("Discard returned before the old QEMU was gone")
	}
	if err := os.Rename(stagedDisk, e.disk); err != nil {
		t.Fatal(err)
	}
	moved := vmm.RunDir(filepath.Join(e.dir, "c"))
	if err := w.MoveRunDir(moved); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "b")); !os.IsNotExist(err) {
		t.Fatalf("the prelaunch's run dir is still there after the move: %v", err)
	}
	if err := w.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: staged, WaitStaged: wait, Config: ptr(e.config())}); err != nil {
		t.Fatal(err)
	}
	c2 := e.connect(t, w)
	// Read from the disk, not the page cache the memory brought back.
	if out, code := run(t, c2, "echo 3 > /proc/sys/vm/drop_caches; cat /tmp/note /root/mark"); code != 0 || out != "in-memory\non-disk\n" {
		t.Fatalf("after a prelaunched restore: %q (exit %d)", out, code)
	}
	if pid, err := vmm.AdoptProcess(moved.PIDFile()); err != nil || pid.PID() != w.PID() {
		t.Fatalf("the moved run dir's PID file: %v %v", pid, err)
	}

	// A prelaunch for other staged memory than the restore's is refused,
	// and its QEMU stopped.
	wait, err = qemu.StageMemory(snap, "", staged, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := e.newVMM(t, "d")
	if err := x.Prelaunch(ctx, e.config(), vmm.Prelaunch{Memory: staged}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(e.dir, "staged", "other")
	if err := x.Restore(ctx, snap, vmm.RestoreOptions{Resume: true, StagedMemory: other, WaitStaged: wait}); err == nil || !strings.Contains(err.Error(), "prelaunched") {
		t.Fatalf("restore of other memory into a prelaunched qemu: %v", err)
	}
	select {
	case <-x.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the refused prelaunched qemu still runs")
	}
}

func ptr[T any](v T) *T { return &v }

// TestConfinedStartWhateverTheUmask: a run dir and RAM dir made without
// search permission (under a umask such as 0177, which a daemon thread
// may have set meanwhile) still let the confined QEMU start.
func TestConfinedStartWhateverTheUmask(t *testing.T) {
	e := newGuestEnv(t)
	rd := filepath.Join(e.dir, "u")
	ramDir := filepath.Join(e.dir, "ram-u")
	for _, d := range []string{rd, ramDir} {
		if err := os.Mkdir(d, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	v := qemu.New(qemu.Options{RunDir: vmm.RunDir(rd), RAMFile: filepath.Join(ramDir, "memory"), Confine: confine(t, "u")})
	ctx := context.Background()
	if err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Shutdown(context.Background()) })
	if err := v.Create(ctx, e.config()); err != nil {
		t.Fatal(err)
	}
	if info, err := v.Info(ctx); err != nil || info.State != vmm.StateCreated {
		t.Fatalf("created vm: %+v %v", info, err)
	}
}
