package cloudhypervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The pinned Cloud Hypervisor release: scripts/deps-ch.sh installs it and
// `den doctor` compares the binary it finds with it. The checksums are of
// the upstream release assets (keep them in step with scripts/deps-ch.sh;
// a test checks that they agree).
const (
	PinnedVersion = "v53.0"

	PinnedURL    = "https://github.com/cloud-hypervisor/cloud-hypervisor/releases/download/" + PinnedVersion + "/cloud-hypervisor-static"
	PinnedSHA256 = "448af3d4e59b22c2987f7df94c213ad40fb53a10d437e42b5ee6c4fce7c29ecc"

	PinnedURLAarch64    = PinnedURL + "-aarch64"
	PinnedSHA256Aarch64 = "f192b510eea1c710cbc439d716bb0573c223fc463dbe3e6523788a2b7ef62850"
)

// BinaryEnv names the environment variable that points at the
// cloud-hypervisor binary to use; it wins over PATH.
const BinaryEnv = "DEN_CH_BINARY"

// FindBinary locates cloud-hypervisor: $DEN_CH_BINARY if set, else
// `cloud-hypervisor` in PATH. The error wraps exec.ErrNotFound when there
// is none.
func FindBinary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %w", BinaryEnv, p, err)
		}
		if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s: not an executable file", BinaryEnv, p)
		}
		return p, nil
	}
	p, err := exec.LookPath("cloud-hypervisor")
	if err != nil {
		return "", fmt.Errorf("cloud-hypervisor not found (set %s or put it in PATH; scripts/deps-ch.sh installs %s into bin/): %w",
			BinaryEnv, PinnedVersion, exec.ErrNotFound)
	}
	return p, nil
}

// versionTimeout bounds Version when its context has no deadline.
const versionTimeout = 5 * time.Second

// Version runs `binary --version` and returns the version it reports
// ("v53.0" from "cloud-hypervisor v53.0").
func Version(ctx context.Context, binary string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, versionTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, binary, "--version")
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return "", fmt.Errorf("%s --version: no answer: %w", binary, ctx.Err())
	}
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", binary, err, strings.TrimSpace(out.String()))
	}
	v, err := parseVersion(out.String())
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	return v, nil
}

// parseVersion finds the version in `cloud-hypervisor --version` output:
// the word after "cloud-hypervisor" on the first line that has one.
func parseVersion(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "cloud-hypervisor" {
			return f[1], nil
		}
	}
	if s := strings.TrimSpace(out); s != "" {
		return "", fmt.Errorf("unexpected output %q", firstLine(s))
	}
	return "", errors.New("no output")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// IsPinned reports whether a version reported by the binary (--version, or
// build_version from vmm.ping) is the pinned release. Release binaries
// spell it "v53.0" or "v53.0.0"; a build past the tag ("v53.0-246-g…") is
// not the release.
func IsPinned(version string) bool {
	v := strings.TrimSpace(version)
	return v == PinnedVersion || v == PinnedVersion+".0"
}
