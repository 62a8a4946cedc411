// Package image is the typed layout of a built guest image directory (what
// `make image`, i.e. scripts/build-image.sh, writes): the guest kernel in
// both forms, the initramfs, the root filesystem disks and the manifest that
// lists them, so that other packages find guest images without knowing file
// names.
//
// The kernel is Debian's linux-image-*-cloud-amd64. Its virtio drivers are
// modules, so every boot needs the initramfs: it loads them, waits for the
// root disk on /dev/vda (ext4), mounts it and switch_roots into /sbin/init
// (or init= from the command line). Kernel command line it understands:
// root=, rootfstype=, rootflags=, ro/rw, init=, den.rootwait=SECS,
// den.shell, and den.identity=TOKEN with den.hostname=NAME: when the token
// differs from the root's /etc/den/identity, the guest takes a new
// identity (hostname, machine-id, host keys) before its init starts. On
// failure it prints a line starting "den-initramfs: FATAL:" and powers the
// VM off.
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// EnvDir names the environment variable that points at the image directory.
const EnvDir = "DEN_IMAGE_DIR"

// Root filesystem names for Dir.RootDisk.
const (
	// Minimal is busybox with den-agent as /sbin/init: boots in seconds.
	Minimal = "minimal"
	// Debian is Debian bookworm with systemd; den-agent runs as a unit.
	Debian = "debian"
)

// RootDisks lists the root filesystems a complete image directory holds.
var RootDisks = []string{Minimal, Debian}

// FatalMarker starts the console line the initramfs prints before it powers
// the VM off on a failure (no root disk, a module that does not load...).
const FatalMarker = "den-initramfs: FATAL:"

// SwitchRootMarker starts the console line the initramfs prints right before
// it hands over to the root filesystem's init.
const SwitchRootMarker = "den-initramfs: switch_root to "

// Dir is a guest image directory.
type Dir string

// Path is the directory itself.
func (d Dir) Path() string { return string(d) }

// BzImage is the kernel as Debian ships it (a bzImage, for QEMU -kernel or
// Cloud Hypervisor's bzImage boot).
func (d Dir) BzImage() string { return filepath.Join(string(d), "bzImage") }

// Vmlinux is the same kernel as an ELF with the Xen PVH entry note, for
// Cloud Hypervisor's --kernel.
func (d Dir) Vmlinux() string { return filepath.Join(string(d), "vmlinux") }

// Initramfs is the gzip'd cpio initramfs that loads the virtio modules and
// switch_roots into the root disk.
func (d Dir) Initramfs() string { return filepath.Join(string(d), "initramfs.img") }

// RootDisk is the raw ext4 image of the named root filesystem (Minimal or
// Debian). The file is the pristine base: clone or copy it, never boot it
// read-write in place.
func (d Dir) RootDisk(name string) string {
	return filepath.Join(string(d), name+".ext4")
}

// ManifestPath is the manifest.json that lists the artifacts.
func (d Dir) ManifestPath() string { return filepath.Join(string(d), "manifest.json") }

// DefaultDir is the image directory from $DEN_IMAGE_DIR, else build/images
// in the den repository that holds the working directory (found through its
// go.mod). The directory need not exist or be built: see Dir.Check.
func DefaultDir() (Dir, error) {
	if p := os.Getenv(EnvDir); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", fmt.Errorf("image: %s=%s: %w", EnvDir, p, err)
		}
		return Dir(abs), nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("image: %s is not set and the working directory is unknown: %w", EnvDir, err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
			strings.Contains(string(data), "module github.com/denhq/den\n") {
			return Dir(filepath.Join(d, "build", "images")), nil
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("image: %s is not set and %s is not inside the den repository", EnvDir, wd)
}

// Manifest is manifest.json: what was built, from which kernel, and the
// key (hash of all inputs) of every artifact.
type Manifest struct {
	Format    int        `json:"format"`
	Kernel    Kernel     `json:"kernel"`
	Artifacts []Artifact `json:"artifacts"`
}

// Kernel is the Debian kernel package the image was built from.
type Kernel struct {
	Package string `json:"package"` // e.g. linux-image-6.1.0-56-cloud-amd64
	Version string `json:"version"` // Debian package version, e.g. 6.1.192-2
	Release string `json:"release"` // uname -r, e.g. 6.1.0-56-cloud-amd64
}

// Artifact is one file of the image directory.
type Artifact struct {
	Name      string `json:"name"` // bzImage, vmlinux, initramfs, minimal, debian
	File      string `json:"file"` // relative to the directory
	Kind      string `json:"kind"` // kernel, initramfs or rootfs
	Size      int64  `json:"size"` // apparent size in bytes
	DiskUsage int64  `json:"disk_usage"`
	Key       string `json:"key"`   // hash of the artifact's inputs
	Built     string `json:"built"` // RFC 3339, UTC
}

// ErrNotBuilt is returned (wrapped) when the directory has no manifest.
var ErrNotBuilt = errors.New("guest image not built (run: make image)")

// Manifest reads and parses manifest.json.
func (d Dir) Manifest() (Manifest, error) {
	var m Manifest
	data, err := os.ReadFile(d.ManifestPath())
	if errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("image: %s: %w", d.ManifestPath(), ErrNotBuilt)
	}
	if err != nil {
		return m, fmt.Errorf("image: %w", err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("image: %s: %w", d.ManifestPath(), err)
	}
	if m.Format != 1 {
		return m, fmt.Errorf("image: %s: unknown format %d", d.ManifestPath(), m.Format)
	}
	return m, nil
}

// Artifact returns the manifest entry with that name.
func (m Manifest) Artifact(name string) (Artifact, bool) {
	for _, a := range m.Artifacts {
		if a.Name == name {
			return a, true
		}
	}
	return Artifact{}, false
}

// Check reports whether the directory holds the kernel, the initramfs and
// the named root disks (all of RootDisks when none are named), each listed
// in the manifest with the size it has on disk. The error wraps ErrNotBuilt
// when the image is missing, so callers and tests can skip with its text.
func (d Dir) Check(rootDisks ...string) error {
	m, err := d.Manifest()
	if err != nil {
		return err
	}
	if len(rootDisks) == 0 {
		rootDisks = RootDisks
	}
	names := append([]string{"bzImage", "vmlinux", "initramfs"}, rootDisks...)
	for _, n := range names {
		a, ok := m.Artifact(n)
		if !ok {
			return fmt.Errorf("image: %s lists no %s: %w", d.ManifestPath(), n, ErrNotBuilt)
		}
		st, err := os.Stat(filepath.Join(string(d), a.File))
		if err != nil {
			return fmt.Errorf("image: %s: %w", n, err)
		}
		if st.Size() != a.Size {
			return fmt.Errorf("image: %s: %s is %d bytes, the manifest says %d (rebuild: make image)",
				n, a.File, st.Size(), a.Size)
		}
	}
	return nil
}
