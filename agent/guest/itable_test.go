//go:build linux

package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestItableInitRealMount sets noinit_itable, then init_itable, then
// noinit_itable again on a real ext4 mount (a loop device over an image
// mkfs.ext4 made) and finds each in mountinfo, with the mount's other
// options as they were.
func TestItableInitRealMount(t *testing.T) {
	testutil.NeedRoot(t, "mount a loop device")
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4 (apt-get install e2fsprogs)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.ext4"), filepath.Join(dir, "mnt")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop,nosuid,nodev", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a loop device here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	for _, on := range []bool{false, true, false} {
		if err := setItableInit(mnt, on); err != nil {
			t.Fatal(err)
		}
		line := mountLine(t, mnt)
		if strings.Contains(line, "noinit_itable") == on {
			t.Errorf("init_itable %v: mountinfo line %q", on, line)
		}
		for _, want := range []string{"nosuid", "nodev", " rw,"} {
			if !strings.Contains(line, want) {
				t.Errorf("mountinfo line %q lacks %q", line, want)
			}
		}
	}
}

// mountLine is mnt's line in this process's mountinfo.
func mountLine(t *testing.T, mnt string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == mnt {
			return l
		}
	}
	t.Fatalf("%s not in mountinfo", mnt)
	return ""
}
