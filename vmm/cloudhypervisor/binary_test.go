package cloudhypervisor

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFindBinary(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "cloud-hypervisor")
	writeFile(t, exe, []byte("#!/bin/sh\n"))
	must(t, "chmod", os.Chmod(exe, 0o755))
	plain := filepath.Join(dir, "plain")
	writeFile(t, plain, nil)

	t.Setenv(BinaryEnv, exe)
	if got, err := FindBinary(); err != nil || got != exe {
		t.Errorf("env: %q, %v", got, err)
	}
	t.Setenv(BinaryEnv, filepath.Join(dir, "missing"))
	if _, err := FindBinary(); err == nil || !strings.Contains(err.Error(), BinaryEnv) {
		t.Errorf("missing env binary: %v", err)
	}
	t.Setenv(BinaryEnv, plain)
	if _, err := FindBinary(); err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Errorf("non-executable env binary: %v", err)
	}

	t.Setenv(BinaryEnv, "")
	t.Setenv("PATH", dir)
	if got, err := FindBinary(); err != nil || got != exe {
		t.Errorf("PATH: %q, %v", got, err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := FindBinary(); !errors.Is(err, exec.ErrNotFound) || !strings.Contains(err.Error(), "deps-ch.sh") {
		t.Errorf("none: %v", err)
	}
}

func TestVersion(t *testing.T) {
	self, err := os.Executable()
	must(t, "test binary", err)
	t.Setenv("DEN_CH_FAKE", "version")
	v, err := Version(testCtx(t, 10*time.Second), self)
	if err != nil || v != "v53.0" || !IsPinned(v) {
		t.Errorf("version %q, %v", v, err)
	}

	t.Setenv("DEN_CH_FAKE", "version-hang")
	start := time.Now()
	_, err = Version(testCtx(t, 300*time.Millisecond), self)
	if err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("hanging binary: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %s", d)
	}

	if _, err := Version(testCtx(t, 5*time.Second), "/bin/false"); err == nil {
		t.Error("a failing binary gave a version")
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"cloud-hypervisor v48.0.0\n":                               "v48.0.0",
		"cloud-hypervisor v53.0\nMigration Protocol Versions: 0\n": "v53.0",
	} {
		if got, err := parseVersion(out); err != nil || got != want {
			t.Errorf("parseVersion(%q) = %q, %v", out, got, err)
		}
	}
	for _, out := range []string{"", "qemu 8.2\n"} {
		if _, err := parseVersion(out); err == nil {
			t.Errorf("parseVersion(%q) succeeded", out)
		}
	}
	for v, want := range map[string]bool{"v53.0": true, "v53.0.0": true, "v53.0-246-gae44c2971-dirty": false, "v48.0": false} {
		if IsPinned(v) != want {
			t.Errorf("IsPinned(%q) != %v", v, want)
		}
	}
}

// The install script pins the same release and checksums as the package.
func TestPinsMatchScript(t *testing.T) {
	data, err := os.ReadFile("../../scripts/deps-ch.sh")
	must(t, "read scripts/deps-ch.sh", err)
	s := string(data)
	for _, want := range []string{`"` + PinnedVersion + `"`, PinnedSHA256, PinnedSHA256Aarch64, "cloud-hypervisor-static"} {
		if !strings.Contains(s, want) {
			t.Errorf("scripts/deps-ch.sh does not pin %s", want)
		}
	}
	if !strings.HasSuffix(PinnedURL, "/"+PinnedVersion+"/cloud-hypervisor-static") {
		t.Errorf("PinnedURL %s", PinnedURL)
	}
}
