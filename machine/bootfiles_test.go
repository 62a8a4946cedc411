//go:build linux

package machine_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/denhq/den/internal/testutil"
	"github.com/denhq/den/registry"
)

// TestBootFilesByContent: a VM boots the kernel and initramfs it was made
// with, imported onto the volume by their content: every host boots the
// same bytes, and a rebuild of the image directory changes the kernel of
// the VMs made after it, not of those made before.
func TestBootFilesByContent(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("old")
	kernelOf := func(name string) (path, content string) {
		t.Helper()
		v := e.drv.VM(e.state.Run(name))
		if v == nil {
			t.Fatalf("%s runs no vmm", name)
		}
		cfg := v.Config()
		for _, f := range []string{cfg.Kernel, cfg.Initramfs} {
			rel, err := filepath.Rel(e.vol.Root(), f)
			if err != nil || !regexp.MustCompile(`^boot/[0-9a-f]{64}/[a-z.]+$`).MatchString(rel) {
				t.Fatalf("%s boots %s, not a file of the volume named by its content", name, f)
			}
		}
		data, err := os.ReadFile(cfg.Kernel)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Kernel, string(data)
	}
	oldPath, oldKernel := kernelOf("old")
	if !strings.HasPrefix(oldKernel, "fake ") {
		t.Fatalf("the volume's kernel holds %q", oldKernel)
	}

	// The image directory is rebuilt with another kernel.
	for _, f := range []string{e.images.Vmlinux(), e.images.BzImage()} {
		if err := os.WriteFile(f, []byte("rebuilt"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.create("new")
	newPath, newKernel := kernelOf("new")
	if newPath == oldPath || newKernel != "rebuilt" {
		t.Fatalf("a VM made after the rebuild boots %s (%q)", newPath, newKernel)
	}

	// The VM made before boots its own kernel still.
	e.drv.VM(e.state.Run("old")).Kill()
	testutil.WaitForWithin(t, testTimeout, "old recorded stopped", func() bool { return e.record("old").State == registry.StateStopped })
	if err := e.m.Wake(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if p, k := kernelOf("old"); p != oldPath || k != oldKernel {
		t.Fatalf("a VM made before the rebuild boots %s (%q) after it, was %s", p, k, oldPath)
	}
}
