//go:build linux

package guest

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/agent"
)

// growTree is a fake guest for rootGrower: mountinfo, a sysfs with one
// block device, and its device node, a file holding an ext4 superblock
// whose block count the fake resize rewrites as the kernel would.
type growTree struct {
	t      *testing.T
	g      *rootGrower
	sysDir string // the device's sysfs directory
	node   string

	mu      sync.Mutex
	resizes []uint64
	fail    error
	events  []string // "init_itable", "resize", "noinit_itable", in order
}

const testMajMin = "254:0"

func newGrowTree(t *testing.T, fstype string, blockSize, fsBlocks uint64, devBytes int64) *growTree {
	t.Helper()
	dir := t.TempDir()
	mi := filepath.Join(dir, "proc", "self", "mountinfo")
	writeFile(t, mi, strings.Join([]string{
		"20 1 0:5 / /dev rw,nosuid - devtmpfs devtmpfs rw,size=120000k",
		"1 0 " + testMajMin + " / / rw,relatime - " + fstype + " /dev/vda rw",
		"21 1 0:20 / /proc rw,nosuid,nodev,noexec - proc proc rw",
		"22 1 0:21 / /sys rw,nosuid,nodev,noexec - sysfs sysfs rw",
		"23 1 254:16 / /data rw,relatime - ext4 /dev/vdb rw",
	}, "\n")+"\n")
	sys := filepath.Join(dir, "sys")
	sysDir := filepath.Join(sys, "devices", "platform", "virtio-mmio.0", "virtio1", "block", "vda")
	writeFile(t, filepath.Join(sysDir, "size"), fmt.Sprintf("%d\n", devBytes/512))
	if err := os.MkdirAll(filepath.Join(sys, "dev", "block"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../devices/platform/virtio-mmio.0/virtio1/block/vda", filepath.Join(sys, "dev", "block", testMajMin)); err != nil {
		t.Fatal(err)
	}
	devDir := filepath.Join(dir, "dev")
	node := filepath.Join(devDir, "vda")
	writeFile(t, node, "")
	tr := &growTree{t: t, sysDir: sysDir, node: node}
	tr.writeSuper(blockSize, fsBlocks)
	tr.g = &rootGrower{
		mountinfo: mi, sysfs: sys, devDir: devDir, root: "/",
		resize: func(root string, blocks uint64) error {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if root != "/" {
				t.Errorf("resize of %q, want /", root)
			}
			if tr.fail != nil {
				return tr.fail
			}
			tr.resizes = append(tr.resizes, blocks)
			tr.events = append(tr.events, "resize")
			tr.writeSuper(blockSize, blocks)
			return nil
		},
		deviceWait: 300 * time.Millisecond,
		itableInit: func(root string, on bool) error {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			tr.events = append(tr.events, map[bool]string{true: "init_itable", false: "noinit_itable"}[on])
			return nil
		},
	}
	return tr
}

// writeSuper writes an ext4 superblock (64bit feature on) to the node.
func (tr *growTree) writeSuper(blockSize, blocks uint64) {
	b := make([]byte, sbOffset+sbSize)
	sb := b[sbOffset:]
	le := binary.LittleEndian
	le.PutUint16(sb[sbMagic:], ext4Magic)
	log := uint32(0)
	for 1024<<log < blockSize {
		log++
	}
	le.PutUint32(sb[sbLogBlockSize:], log)
	le.PutUint32(sb[sbFeatureIncompat:], incompat64Bit|0x2|0x40)
	le.PutUint32(sb[sbBlocksLo:], uint32(blocks))
	le.PutUint32(sb[sbBlocksHi:], uint32(blocks>>32))
	if err := os.WriteFile(tr.node, b, 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

// setDeviceBytes sets the device's size as the kernel does: the agent
// reading sysfs meanwhile sees the old size or the new one, never an
// empty file (so the file is replaced, not rewritten in place).
func (tr *growTree) setDeviceBytes(n int64) {
	p := filepath.Join(tr.sysDir, "size")
	writeFile(tr.t, p+".new", fmt.Sprintf("%d\n", n/512))
	if err := os.Rename(p+".new", p); err != nil {
		tr.t.Error(err)
	}
}

func (tr *growTree) calls() []uint64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]uint64(nil), tr.resizes...)
}

func testFreezeState(t *testing.T) *freezeState {
	return newFreezeState(&fakeSys{mounts: []string{"/"}}, slog.New(slog.DiscardHandler))
}

func TestGrowRootGrowsOnce(t *testing.T) {
	tr := newGrowTree(t, "ext4", 1024, 256<<10, 1<<30) // 256 MiB of 1 KiB blocks on 1 GiB
	st := testFreezeState(t)
	rep, err := tr.g.grow(nil, 0, st)
	if err != nil {
		t.Fatal(err)
	}
	want := agent.GrowReply{Device: tr.node, DeviceBytes: 1 << 30, OldBytes: 256 << 20, NewBytes: 1 << 30}
	if rep != want {
		t.Errorf("reply %+v, want %+v", rep, want)
	}
	if got := tr.calls(); len(got) != 1 || got[0] != 1<<20 {
		t.Errorf("resizes %v, want [%d]", got, 1<<20)
	}
	// The resize runs with init_itable (the new groups' tables are left
	// to the lazy thread, not zeroed inside it), which is then stopped.
	if got, want := tr.eventList(), []string{"init_itable", "resize", "noinit_itable"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	// Again: the filesystem fills the device, nothing to do but make
	// sure the lazy thread is stopped (an earlier boot's grow).
	rep, err = tr.g.grow(nil, 1<<30, st)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OldBytes != 1<<30 || rep.NewBytes != 1<<30 || len(tr.calls()) != 1 {
		t.Errorf("second grow: %+v, resizes %v", rep, tr.calls())
	}
	if got, want := tr.eventList(), []string{"init_itable", "resize", "noinit_itable", "noinit_itable"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

func (tr *growTree) eventList() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.events)
}

func TestGrowRootBeyond32BitBlocks(t *testing.T) {
	// 20 TiB of 4 KiB blocks is more than 2^32 blocks: the high word counts.
	tr := newGrowTree(t, "ext4", 4096, 1<<16, 20<<40)
	rep, err := tr.g.grow(nil, 0, testFreezeState(t))
	if err != nil {
		t.Fatal(err)
	}
	if rep.NewBytes != 20<<40 || tr.calls()[0] != 20<<40/4096 {
		t.Errorf("reply %+v, resizes %v", rep, tr.calls())
	}
}

func TestGrowRootWaitsForDevice(t *testing.T) {
	tr := newGrowTree(t, "ext4", 4096, 1<<16, 256<<20)
	tr.g.deviceWait = 5 * time.Second
	go func() {
		time.Sleep(100 * time.Millisecond)
		tr.setDeviceBytes(2 << 30)
	}()
	rep, err := tr.g.grow(nil, 2<<30, testFreezeState(t))
	if err != nil {
		t.Fatal(err)
	}
	if rep.DeviceBytes != 2<<30 || rep.NewBytes != 2<<30 {
		t.Errorf("reply %+v", rep)
	}
}

func TestGrowRootDeviceNeverGrows(t *testing.T) {
	tr := newGrowTree(t, "ext4", 4096, 1<<16, 256<<20)
	start := time.Now()
	_, err := tr.g.grow(nil, 1<<30, testFreezeState(t))
	if err == nil || !strings.Contains(err.Error(), "has not seen the new disk size") {
		t.Fatalf("error %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v, want about %v", d, tr.g.deviceWait)
	}
	if len(tr.calls()) != 0 {
		t.Errorf("resized anyway: %v", tr.calls())
	}
}

func TestGrowRootRefusals(t *testing.T) {
	t.Run("frozen", func(t *testing.T) {
		tr := newGrowTree(t, "ext4", 4096, 1<<16, 1<<30)
		st := testFreezeState(t)
		if _, err := st.freeze(nil, time.Minute); err != nil {
			t.Fatal(err)
		}
		defer st.thaw()
		_, err := tr.g.grow(nil, 0, st)
		if err == nil || !strings.Contains(err.Error(), "frozen") || len(tr.calls()) != 0 {
			t.Fatalf("grow while frozen: %v, resizes %v", err, tr.calls())
		}
	})
	t.Run("not ext4", func(t *testing.T) {
		tr := newGrowTree(t, "xfs", 4096, 1<<16, 1<<30)
		_, err := tr.g.grow(nil, 0, testFreezeState(t))
		if err == nil || !strings.Contains(err.Error(), "only ext4") {
			t.Fatalf("grow of xfs: %v", err)
		}
	})
	t.Run("partition", func(t *testing.T) {
		tr := newGrowTree(t, "ext4", 4096, 1<<16, 1<<30)
		writeFile(t, filepath.Join(tr.sysDir, "partition"), "1\n")
		_, err := tr.g.grow(nil, 0, testFreezeState(t))
		if err == nil || !strings.Contains(err.Error(), "partition vda") {
			t.Fatalf("grow of a partition: %v", err)
		}
	})
	t.Run("no superblock", func(t *testing.T) {
		tr := newGrowTree(t, "ext4", 4096, 1<<16, 1<<30)
		writeFile(t, tr.node, strings.Repeat("x", 4096))
		_, err := tr.g.grow(nil, 0, testFreezeState(t))
		if err == nil || !strings.Contains(err.Error(), "no ext2/3/4 superblock") {
			t.Fatalf("grow without a superblock: %v", err)
		}
	})
	t.Run("kernel refuses", func(t *testing.T) {
		tr := newGrowTree(t, "ext4", 4096, 1<<16, 1<<30)
		tr.fail = fmt.Errorf("EXT4_IOC_RESIZE_FS: simulated")
		_, err := tr.g.grow(nil, 0, testFreezeState(t))
		if err == nil || !strings.HasPrefix(err.Error(), "grow root filesystem: ") || !strings.Contains(err.Error(), "simulated") {
			t.Fatalf("grow that fails: %v", err)
		}
	})
}

func TestFindMount(t *testing.T) {
	mi := strings.Join([]string{
		"1 0 254:0 / / ro,relatime - ext4 /dev/vda ro",
		"30 1 0:30 / /with\\040space rw - tmpfs tmpfs rw",
		"31 1 254:1 / / rw,relatime - ext4 /dev/vdb rw", // stacked on /: the topmost counts
		"garbage",
	}, "\n")
	m, err := findMount(strings.NewReader(mi), "/")
	if err != nil {
		t.Fatal(err)
	}
	if m.majMin != "254:1" || m.source != "/dev/vdb" || m.fstype != "ext4" || m.readOnly {
		t.Errorf("root mount %+v", m)
	}
	m, err = findMount(strings.NewReader(mi), "/with space")
	if err != nil || m.fstype != "tmpfs" {
		t.Errorf("escaped mount point: %+v %v", m, err)
	}
	m, _ = findMount(strings.NewReader(mi+"\n32 1 254:2 / / rw - ext4 /dev/vdc ro"), "/")
	if !m.readOnly {
		t.Errorf("superblock ro not seen: %+v", m)
	}
	if _, err := findMount(strings.NewReader(mi), "/nowhere"); err == nil {
		t.Error("a missing mount point was found")
	}
}

// TestExt4SuperOfRealImage checks the superblock offsets against
// filesystems mkfs.ext4 made.
func TestExt4SuperOfRealImage(t *testing.T) {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs)")
	}
	for _, c := range []struct {
		args      []string
		size      int64
		blockSize uint64
	}{
		{[]string{"-b", "1024", "-O", "^64bit"}, 64 << 20, 1024},
		{[]string{"-b", "4096", "-O", "64bit"}, 96 << 20, 4096},
	} {
		img := filepath.Join(t.TempDir(), "fs.img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, c.size); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"-q", "-F"}, append(c.args, img)...)
		if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4 %v: %v\n%s", args, err, out)
		}
		sb, err := readExt4Super(img)
		if err != nil {
			t.Fatal(err)
		}
		if sb.blockSize != c.blockSize || sb.bytes() != c.size {
			t.Errorf("mkfs.ext4 %v of %d bytes: superblock says %d blocks of %d", c.args, c.size, sb.blocks, sb.blockSize)
		}
	}
}

// TestGrowRootRequest goes through the agent's control request with the
// grower pointed at a fake tree.
func TestGrowRootRequest(t *testing.T) {
	tr := newGrowTree(t, "ext4", 4096, 1<<16, 1<<30)
	orig := newRootGrower
	newRootGrower = func(*System) *rootGrower { return tr.g }
	t.Cleanup(func() { newRootGrower = orig })

	h := newHarness(t)
	c := h.dial()
	ctx := testCtx(t)
	rep, err := c.GrowRoot(ctx, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OldBytes != 256<<20 || rep.NewBytes != 1<<30 || rep.DeviceBytes != 1<<30 {
		t.Errorf("reply %+v", rep)
	}
	if _, err := c.Freeze(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	tr.setDeviceBytes(2 << 30)
	if _, err := c.GrowRoot(ctx, 0); err == nil || !strings.Contains(err.Error(), "agent "+agent.ReqGrowRoot+": grow root filesystem: filesystems are frozen") {
		t.Errorf("grow while frozen: %v", err)
	}
	if _, err := c.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if rep, err := c.GrowRoot(ctx, 0); err != nil || rep.NewBytes != 2<<30 {
		t.Errorf("grow after thaw: %+v %v", rep, err)
	}
}
