package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLayout(t *testing.T) {
	d := Dir("/x/images")
	for got, want := range map[string]string{
		d.BzImage():          "/x/images/bzImage",
		d.Vmlinux():          "/x/images/vmlinux",
		d.Initramfs():        "/x/images/initramfs.img",
		d.RootDisk(Minimal):  "/x/images/minimal.ext4",
		d.RootDisk(Debian):   "/x/images/debian.ext4",
		d.ManifestPath():     "/x/images/manifest.json",
		Dir("rel").BzImage(): "rel/bzImage",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

func TestDefaultDir(t *testing.T) {
	t.Setenv(EnvDir, "/some/where")
	d, err := DefaultDir()
	if err != nil || d != "/some/where" {
		t.Fatalf("DefaultDir with %s set: %q, %v", EnvDir, d, err)
	}
	t.Setenv(EnvDir, "")
	d, err = DefaultDir()
	if err != nil {
		t.Fatalf("DefaultDir inside the repo: %v", err)
	}
	if !strings.HasSuffix(string(d), filepath.Join("build", "images")) {
		t.Fatalf("DefaultDir inside the repo: %s, want <repo>/build/images", d)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(string(d))), "go.mod")); err != nil {
		t.Fatalf("DefaultDir %s is not under the repo root: %v", d, err)
	}
}

func TestManifestAndCheck(t *testing.T) {
	d := Dir(t.TempDir())
	if err := d.Check(); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Check of an empty dir: %v, want ErrNotBuilt", err)
	}
	files := map[string]string{"bzImage": "bzImage", "vmlinux": "vmlinux", "initramfs": "initramfs.img", "minimal": "minimal.ext4"}
	var arts []string
	for name, file := range files {
		if err := os.WriteFile(filepath.Join(d.Path(), file), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		arts = append(arts, fmt.Sprintf(`{"name": %q, "file": %q, "kind": "x", "size": %d, "disk_usage": 4096, "key": "k", "built": "2026-11-21T07:59:56Z"}`, name, file, len(name)))
	}
	manifest := `{"format": 1, "kernel": {"package": "linux-image-6.1.0-56-cloud-amd64", "version": "6.1.192-2", "release": "6.1.0-56-cloud-amd64"}, "artifacts": [` + strings.Join(arts, ",") + `]}`
	if err := os.WriteFile(d.ManifestPath(), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := d.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Kernel.Release != "6.1.0-56-cloud-amd64" || len(m.Artifacts) != 4 {
		t.Fatalf("manifest: %+v", m)
	}
	if a, ok := m.Artifact("initramfs"); !ok || a.File != "initramfs.img" || a.Size != int64(len("initramfs")) {
		t.Fatalf("Artifact(initramfs) = %+v, %v", a, ok)
	}
	if err := d.Check(Minimal); err != nil {
		t.Fatalf("Check(minimal): %v", err)
	}
	if err := d.Check(); !errors.Is(err, ErrNotBuilt) || !strings.Contains(err.Error(), "debian") {
		t.Fatalf("Check() without debian: %v", err)
	}
	if err := os.WriteFile(d.Vmlinux(), []byte("longer than before"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Check(Minimal); err == nil || errors.Is(err, ErrNotBuilt) || !strings.Contains(err.Error(), "vmlinux") {
		t.Fatalf("Check after vmlinux changed size: %v", err)
	}
}

// builtDir is the built image directory, or skips the test saying why.
func builtDir(t *testing.T) Dir {
	t.Helper()
	d, err := DefaultDir()
	if err != nil {
		t.Skipf("no image directory: %v", err)
	}
	if err := d.Check(); errors.Is(err, ErrNotBuilt) {
		t.Skipf("%v (in %s)", err, d)
	} else if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBuiltKernel(t *testing.T) {
	d := builtDir(t)
	bz, err := os.ReadFile(d.BzImage())
	if err != nil {
		t.Fatal(err)
	}
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		t.Fatalf("%s is not a bzImage (no HdrS)", d.BzImage())
	}
	f, err := elf.Open(d.Vmlinux())
	if err != nil {
		t.Fatalf("vmlinux: %v", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		t.Fatalf("vmlinux machine %v", f.Machine)
	}
	const xenElfnotePhys32Entry = 18
	found := false
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			t.Fatal(err)
		}
		for len(data) >= 12 {
			namesz := binary.LittleEndian.Uint32(data[0:])
			descsz := binary.LittleEndian.Uint32(data[4:])
			typ := binary.LittleEndian.Uint32(data[8:])
			name := data[12:]
			if int(namesz) <= len(name) && string(bytes.TrimRight(name[:namesz], "\x00")) == "Xen" && typ == xenElfnotePhys32Entry {
				found = true
			}
			next := 12 + align4(namesz) + align4(descsz)
			if next > len(data) {
				break
			}
			data = data[next:]
		}
	}
	if !found {
		t.Fatalf("%s has no Xen PVH entry note: Cloud Hypervisor cannot boot it", d.Vmlinux())
	}
	m, err := d.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.Kernel.Package, "linux-image-") || !strings.HasSuffix(m.Kernel.Release, "-cloud-amd64") || m.Kernel.Version == "" {
		t.Fatalf("manifest kernel: %+v", m.Kernel)
	}
	if !bytes.Contains(bz, []byte(m.Kernel.Release)) {
		t.Errorf("bzImage does not carry the release %s of the manifest", m.Kernel.Release)
	}
}

func align4(n uint32) int { return int((n + 3) &^ 3) }

// cpioFiles reads a gzip'd cpio newc archive: name -> (mode, content).
func cpioFiles(t *testing.T, path string) map[string]cpioEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	files := map[string]cpioEntry{}
	for off := 0; ; {
		if off+110 > len(data) || string(data[off:off+6]) != "070701" {
			t.Fatalf("%s: bad cpio newc header at %d", path, off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(data[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("%s: bad cpio header field at %d", path, off)
			}
			return int(v)
		}
		mode, filesize, namesize := field(1), field(6), field(11)
		nameStart := off + 110
		name := string(data[nameStart : nameStart+namesize-1])
		dataStart := (nameStart + namesize + 3) &^ 3
		if name == "TRAILER!!!" {
			return files
		}
		files[name] = cpioEntry{mode: uint32(mode), data: data[dataStart : dataStart+filesize]}
		off = (dataStart + filesize + 3) &^ 3
	}
}

type cpioEntry struct {
	mode uint32
	data []byte
}

func TestBuiltInitramfs(t *testing.T) {
	d := builtDir(t)
	files := cpioFiles(t, d.Initramfs())
	init, ok := files["init"]
	if !ok || init.mode&0o111 == 0 || !bytes.HasPrefix(init.data, []byte("#!/bin/sh")) {
		t.Fatalf("initramfs: no executable /init script")
	}
	for _, name := range []string{"bin/busybox", "bin/sh", "bin/insmod", "bin/switch_root", "dev/console", "etc/modules.load"} {
		if _, ok := files[name]; !ok {
			t.Errorf("initramfs: no %s", name)
		}
	}
	loaded := strings.Fields(string(files["etc/modules.load"].data))
	pos := map[string]int{}
	for i, m := range loaded {
		pos[strings.TrimSuffix(m, ".ko")] = i
		if _, ok := files["lib/modules/"+m]; !ok {
			t.Errorf("initramfs: modules.load lists %s, but lib/modules/%s is missing", m, m)
		}
	}
	for _, m := range []string{"virtio_ring", "virtio", "virtio_mmio", "virtio_pci", "virtio_pci_legacy_dev",
		"virtio_pci_modern_dev", "virtio_blk", "virtio_net", "net_failover", "failover", "virtio_console",
		"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport"} {
		if _, ok := pos[m]; !ok {
			t.Errorf("initramfs: modules.load lacks %s", m)
		}
	}
	// Dependencies load first.
	for _, dep := range [][2]string{{"virtio_ring", "virtio_blk"}, {"virtio", "virtio_mmio"}, {"failover", "net_failover"},
		{"net_failover", "virtio_net"}, {"vsock", "vmw_vsock_virtio_transport"}} {
		if pos[dep[0]] > pos[dep[1]] {
			t.Errorf("initramfs: %s loads after %s, which depends on it", dep[0], dep[1])
		}
	}
}

func TestBuiltRootDisks(t *testing.T) {
	d := builtDir(t)
	debugfs, err := exec.LookPath("debugfs")
	if err != nil {
		if debugfs, err = exec.LookPath("/sbin/debugfs"); err != nil {
			t.Log("debugfs (e2fsprogs) not found: checking the ext4 superblocks only")
		}
	}
	agentSum := ""
	if agent := agentBinary(); agent != "" {
		data, err := os.ReadFile(agent)
		if err == nil {
			agentSum = fmt.Sprintf("%x", sha256.Sum256(data))
		}
	}
	files := map[string][]string{
		Minimal: {"/sbin/init", "/usr/local/bin/den-agent", "/bin/busybox", "/bin/sh", "/etc/passwd", "/etc/den"},
		Debian: {"/usr/local/bin/den-agent", "/usr/sbin/den-agent", "/etc/systemd/system/den-agent.service",
			"/etc/systemd/system/sysinit.target.wants/den-agent.service", "/usr/lib/systemd/systemd",
			"/usr/bin/git", "/usr/bin/gcc", "/usr/bin/python3", "/etc/den"},
	}
	for _, name := range RootDisks {
		t.Run(name, func(t *testing.T) {
			disk := d.RootDisk(name)
			f, err := os.Open(disk)
			if err != nil {
				t.Fatal(err)
			}
			sb := make([]byte, 2)
			_, err = f.ReadAt(sb, 1024+0x38)
			f.Close()
			if err != nil || binary.LittleEndian.Uint16(sb) != 0xEF53 {
				t.Fatalf("%s: no ext4 superblock (%v)", disk, err)
			}
			if debugfs == "" {
				return
			}
			for _, p := range files[name] {
				out, err := exec.Command(debugfs, "-R", "stat "+p, disk).CombinedOutput()
				if err != nil || bytes.Contains(out, []byte("not found")) {
					t.Errorf("%s: %s missing: %s", name, p, lastLine(out))
				}
			}
			if agentSum != "" {
				tmp := filepath.Join(t.TempDir(), "agent")
				if out, err := exec.Command(debugfs, "-R", "dump /usr/local/bin/den-agent "+tmp, disk).CombinedOutput(); err != nil {
					t.Fatalf("debugfs dump: %v: %s", err, out)
				}
				data, err := os.ReadFile(tmp)
				if err != nil {
					t.Fatal(err)
				}
				if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != agentSum {
					t.Errorf("%s: den-agent in the image is not %s: the image is stale (run: make image)", name, agentBinary())
				}
			}
		})
	}
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// agentBinary is the den-agent the image should hold: $DEN_AGENT_BIN, else
// bin/den-agent beside the image directory's repo, if it exists.
func agentBinary() string {
	if p := os.Getenv("DEN_AGENT_BIN"); p != "" {
		return p
	}
	wd, _ := os.Getwd()
	p := filepath.Join(filepath.Dir(wd), "bin", "den-agent")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// hostTSCKHz is the host's TSC frequency from /proc/cpuinfo: under TCG the
// guest's TSC runs at the host's rate, and tsc_early_khz spares the guest
// calibrating it (which can hang on a busy host).
func hostTSCKHz() int {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(mhz * 1000)
			}
		}
	}
	return 0
}

// bootUntil boots the kernel (bzImage, or the PVH vmlinux, which QEMU boots
// too), initramfs and root disk under QEMU TCG (the
// disk in snapshot mode: the image stays pristine) and reads the serial
// console until every marker has been seen, in order.
func bootUntil(t *testing.T, d Dir, kernel, root string, timeout time.Duration, markers ...string) {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	cmdline := "console=ttyS0 panic=-1"
	if khz := hostTSCKHz(); khz > 0 {
		cmdline += fmt.Sprintf(" tsc_early_khz=%d", khz)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "microvm,acpi=on", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", d.Initramfs(), "-append", cmdline,
		"-drive", "id=root,file="+d.RootDisk(root)+",format=raw,if=none,snapshot=on",
		"-device", "virtio-blk-device,drive=root")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		cmd.Wait()
	}()
	var console []string
	sc := bufio.NewScanner(out)
	next := 0
	for next < len(markers) && sc.Scan() {
		line := ansi.ReplaceAllString(sc.Text(), "")
		console = append(console, line)
		if strings.Contains(line, FatalMarker) || strings.Contains(line, "Kernel panic") {
			t.Fatalf("%s boot failed after %v: %s\nconsole:\n%s", root, time.Since(start).Round(time.Millisecond), line, strings.Join(console, "\n"))
		}
		if strings.Contains(line, markers[next]) {
			t.Logf("%s: %q after %v: %s", root, markers[next], time.Since(start).Round(time.Millisecond), strings.TrimSpace(line))
			next++
		}
	}
	if next < len(markers) {
		t.Fatalf("%s: no %q on the console within %v (cmdline %q)\nconsole:\n%s", root, markers[next], timeout, cmdline, strings.Join(console, "\n"))
	}
}

// ansi matches the colour escapes systemd writes to the console.
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

func TestBootMinimal(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM under QEMU")
	}
	d := builtDir(t)
	for _, kernel := range []string{d.BzImage(), d.Vmlinux()} {
		t.Run(filepath.Base(kernel), func(t *testing.T) {
			bootUntil(t, d, kernel, Minimal, 2*time.Minute,
				"den-initramfs: start", "den-initramfs: loaded", SwitchRootMarker+"/sbin/init")
		})
	}
}

func TestBootDebian(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM under QEMU")
	}
	d := builtDir(t)
	bootUntil(t, d, d.BzImage(), Debian, 3*time.Minute, SwitchRootMarker+"/sbin/init", "Welcome to Debian GNU/Linux", "Started den-agent.service")
}
