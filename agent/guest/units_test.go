//go:build linux

package guest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

func TestParseCmdline(t *testing.T) {
	c := ParseCmdline(`console=ttyS0 den.key=ssh-ed25519:AAA= den.key="ssh-rsa:BBB" den.ip=10.0.0.2/24 den.gw=10.0.0.1 den.dns=1.1.1.1,9.9.9.9 den.dns=8.8.8.8 den.hostname=box quiet` + "\n")
	want := Cmdline{
		Keys: []string{"ssh-ed25519:AAA=", "ssh-rsa:BBB"},
		IP:   "10.0.0.2/24", GW: "10.0.0.1",
		DNS:      []string{"1.1.1.1", "9.9.9.9", "8.8.8.8"},
		Hostname: "box",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got %+v\nwant %+v", c, want)
	}
}

func TestFreezableMounts(t *testing.T) {
	info := `22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
24 22 0:5 / /dev rw,nosuid - devtmpfs devtmpfs rw
30 22 254:16 / /data rw - xfs /dev/vdb rw
31 22 254:16 /sub /mnt/bind rw - xfs /dev/vdb rw
32 22 254:32 / /mnt/with\040space rw - ext4 /dev/vdc rw
33 22 254:48 / /ro ro - ext4 /dev/vdd ro
34 22 0:40 / /run rw - tmpfs tmpfs rw
`
	got, err := freezableMounts(strings.NewReader(info))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/", "/data", "/mnt/with space"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestReadActivityFakeProc(t *testing.T) {
	proc := t.TempDir()
	writeFile(t, filepath.Join(proc, "stat"), "cpu  100 10 50 1000 40 5 5 0 0 0\ncpu0 50 5 25 500 20 2 3 0 0 0\ncpu1 50 5 25 500 20 3 2 0 0 0\nprocesses 999\nprocs_running 3\n")
	writeFile(t, filepath.Join(proc, "loadavg"), "0.75 0.50 0.25 3/120 4242\n")
	writeFile(t, filepath.Join(proc, "1", "stat"), "1 (init) S 0 1 1 0 -1 4194560 1 0 0 0\n")
	writeFile(t, filepath.Join(proc, "2", "stat"), "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0\n")
	writeFile(t, filepath.Join(proc, "77", "stat"), "77 (my (odd) name) R 1 77 77 0 -1 4194304 5 0 0 0\n")
	hdr := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	writeFile(t, filepath.Join(proc, "net", "tcp"), hdr+
		"   0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1\n"+
		"   1: 0F02000A:0016 0202000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 2\n"+
		"   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3\n")
	writeFile(t, filepath.Join(proc, "net", "tcp6"), hdr+
		"   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C351 01 0:0 0:0 0 0 0 4\n"+
		"   1: 0000000000000000FFFF00000F02000A:0016 0000000000000000FFFF00000202000A:D432 01 0:0 0:0 0 0 0 5\n")
	a, err := readActivity(proc)
	if err != nil {
		t.Fatal(err)
	}
	var pc procCounter
	a.Processes = pc.count(proc, time.Second)
	if a.CPUs != 2 || a.CPUTotal != 12100*time.Millisecond || a.CPUBusy != 1700*time.Millisecond {
		t.Errorf("cpu: %d cpus, total %v busy %v", a.CPUs, a.CPUTotal, a.CPUBusy)
	}
	if a.ProcsRunning != 3 || a.Load1 != 0.75 || a.Processes != 2 {
		t.Errorf("procs_running %d load %v processes %d", a.ProcsRunning, a.Load1, a.Processes)
	}
	if a.TCPEstablished != 4 || a.TCPRemote != 2 {
		t.Errorf("tcp established %d remote %d, want 4 and 2", a.TCPEstablished, a.TCPRemote)
	}
}

// TestReadSelfCPU: a process's user and system time, counted past a
// command name with spaces and parentheses in it, and this process's own.
func TestReadSelfCPU(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stat")
	writeFile(t, p, "431 (den (agent) x) S 1 431 431 0 -1 4194560 1811 0 0 0 19 34 0 0 20 0 9 0 160 1265844224 3102 18446744073709551615 1 1 0 0 0 0 0 0 2143420159 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
	if d, err := readSelfCPU(p); err != nil || d != 530*time.Millisecond {
		t.Fatalf("19 user + 34 system ticks: got %v, %v", d, err)
	}
	writeFile(t, p, "431 (den-agent) S 1 431\n")
	if _, err := readSelfCPU(p); err == nil {
		t.Fatal("a short stat line read")
	}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		d, err := readSelfCPU("/proc/self/stat")
		if err != nil {
			t.Fatal(err)
		}
		if d > 0 {
			return
		}
		for i := 0; i < 1e6; i++ { // burn a little CPU until a tick is counted
			_ = strconv.Itoa(i)
		}
	}
	t.Fatal("this process's cpu time stayed at zero")
}

func TestLookupAccount(t *testing.T) {
	etc := t.TempDir()
	home := t.TempDir()
	writeFile(t, filepath.Join(etc, "passwd"), "root:x:0:0:root:/nonexistent-root:/no/such/shell\ndev:x:1000:1000::"+home+":/bin/sh\n")
	writeFile(t, filepath.Join(etc, "group"), "dev:x:1000:\nwheel:x:10:root,dev\ndocker:x:999:dev\nother:x:5:root\n")
	r, err := lookupAccount(etc, "")
	if err != nil || r.UID != 0 || r.Shell != "/bin/sh" || r.Home != "/" {
		t.Errorf("root: %+v %v", r, err)
	}
	d, err := lookupAccount(etc, "dev")
	if err != nil || d.UID != 1000 || d.Home != home || !reflect.DeepEqual(d.Groups, []uint32{1000, 10, 999}) {
		t.Errorf("dev: %+v %v", d, err)
	}
	if _, err := lookupAccount(etc, "nobody-here"); err == nil {
		t.Error("unknown user found")
	}
	if r, err := lookupAccount(t.TempDir(), "root"); err != nil || r.UID != 0 {
		t.Errorf("root without passwd: %+v %v", r, err)
	}
}

func TestAuthorizedKeysSources(t *testing.T) {
	_, k1, _ := agent.NewEd25519Key("file")
	_, k2, _ := agent.NewEd25519Key("cmdline")
	file := filepath.Join(t.TempDir(), "authorized_keys")
	keys := AuthorizedKeys(file, []string{strings.TrimPrefix(agent.AuthorizedKeyArg(k2.PublicKey()), "den.key="), "bogus"}, testLogger(t))
	got, err := keys()
	if err != nil || len(got) != 1 {
		t.Fatalf("without file: %d keys, %v", len(got), err)
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k1.PublicKey())))
	writeFile(t, file, "# comment\n"+line+" host@den\n")
	got, err = keys()
	if err != nil || len(got) != 2 || !bytes.Equal(got[1].Marshal(), k1.PublicKey().Marshal()) {
		t.Fatalf("with file: %d keys, %v", len(got), err)
	}
}

func TestGuestHostKeyFallback(t *testing.T) {
	// /etc/den cannot be created (as on a read-only root): the key goes
	// to the second path, and stays there.
	notDir := filepath.Join(t.TempDir(), "file")
	writeFile(t, notDir, "")
	run := filepath.Join(t.TempDir(), "den", "key")
	s1, path, err := LoadOrCreateHostKey(filepath.Join(notDir, "den", "key"), run)
	if err != nil || path != run {
		t.Fatalf("fallback: %q %v", path, err)
	}
	s2, _, err := LoadOrCreateHostKey(filepath.Join(notDir, "den", "key"), run)
	if err != nil || !bytes.Equal(s1.PublicKey().Marshal(), s2.PublicKey().Marshal()) {
		t.Fatalf("reload: %v", err)
	}
}

func TestLeaseSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "den-agent.sock")
	l, err := ListenLeases(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	leases := NewLeases()
	go leases.ServeLeases(l, testLogger(t))
	ctx := testCtx(t)
	if _, err := LeaseCall(ctx, sock, agent.LeaseRequest{Op: "hold", Name: "build", ForMS: 60000}); err != nil {
		t.Fatal(err)
	}
	rep, err := LeaseCall(ctx, sock, agent.LeaseRequest{Op: "hold"})
	if err != nil || len(rep.Leases) != 2 || rep.Leases[0].Name != "build" || rep.Leases[1].Name != "default" || !rep.Leases[1].Until.IsZero() {
		t.Fatalf("hold: %+v %v", rep, err)
	}
	a := agent.Activity{Leases: leases.List()}
	if !a.Held(time.Now()) {
		t.Error("activity not held")
	}
	if _, err := LeaseCall(ctx, sock, agent.LeaseRequest{Op: "release", Name: "nope"}); err == nil {
		t.Error("releasing an unknown lease succeeded")
	}
	LeaseCall(ctx, sock, agent.LeaseRequest{Op: "release"})
	leases.Hold("short", time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	rep, _ = LeaseCall(ctx, sock, agent.LeaseRequest{Op: "list"})
	if len(rep.Leases) != 1 || rep.Leases[0].Name != "build" {
		t.Errorf("after release and expiry: %+v", rep.Leases)
	}
	if st, _ := os.Stat(sock); st.Mode().Perm() != 0o666 {
		t.Errorf("socket mode %v", st.Mode())
	}
}

// TestFDListener runs the vsock listener code on a unix socket.
func TestFDListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	unix.Listen(fd, 8)
	l, err := NewFDListener(fd, VsockAddr{CID: 3, Port: 1024})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := net.Dial("unix", path)
		if err != nil {
			return
		}
		c.Write([]byte("hello"))
		c.(*net.UnixConn).CloseWrite()
		io.Copy(c, c)
		c.Close()
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q %v", got, err)
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	c.Close()
	done := make(chan error, 1)
	go func() { _, err := l.Accept(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("accept after close succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt Accept")
	}
	if l.Addr().String() != "vsock:3:1024" {
		t.Errorf("addr %s", l.Addr())
	}
}

func TestOpenSerialPort(t *testing.T) {
	sys := t.TempDir()
	writeFile(t, filepath.Join(sys, "vport9p1", "name"), "org.other\n")
	if _, err := OpenSerialPort(sys, agent.SerialPortName); err == nil {
		t.Fatal("found a port that is not there")
	}
	if _, err := OpenSerialPort(filepath.Join(sys, "missing"), agent.SerialPortName); err == nil {
		t.Fatal("found a port without sysfs")
	}
}

func ExampleParseCmdline() {
	c := ParseCmdline("den.hostname=box den.ip=10.0.0.2/24")
	fmt.Println(c.Hostname, c.IP)
	// Output: box 10.0.0.2/24
}
