package storage

import (
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// Path is a slash-separated path relative to the volume root, such as
// "vms/box/disk". Build them with the layout functions below rather than by
// hand; every Volume method validates the Path it is given.
type Path string

// The volume layout:
//
//	images/NAME/...                 guest images' root disks
//	boot/DIGEST/FILE                kernels and initramfs VMs boot, by content
//	vms/NAME/disk                   a VM's active disk
//	vms/NAME/checkpoints/ID/...     a checkpoint: disk clone, memory snapshot
//	vms/NAME/suspend/...            the sleep slot, a checkpoint of its own
//	memstore/packs/...              snapshots' memory by content (package memstore)
//	cluster/agent_ed25519           the key a cluster's hosts reach guest agents with
const (
	imagesDir      = "images"
	bootDir        = "boot"
	vmsDir         = "vms"
	diskFile       = "disk"
	checkpointsDir = "checkpoints"
	suspendDir     = "suspend"
	memstoreDir    = "memstore"
	clusterDir     = "cluster"
)

// BootFile is the kernel or initramfs called file whose content has
// digest: VMs boot the same bytes on every host, whatever its image
// directory holds now.
func BootFile(digest, file string) Path { return join(bootDir, digest, file) }

// BootDir holds the boot files of one digest.
func BootDir(digest string) Path { return join(bootDir, digest) }

// ClusterDir holds what the hosts of a cluster share beside VMs.
func ClusterDir() Path { return Path(clusterDir) }

// AgentKey is the private key every host of a cluster reaches the VMs'
// guest agents with: a VM booted or woken on any host lets it in.
func AgentKey() Path { return join(clusterDir, "agent_ed25519") }

// MemoryStoreDir is the store of snapshots' memory by content.
func MemoryStoreDir() Path { return Path(memstoreDir) }

// ImagesDir holds every image; VMsDir every VM.
func ImagesDir() Path { return Path(imagesDir) }
func VMsDir() Path    { return Path(vmsDir) }

// ImageDir is the directory of the image called name.
func ImageDir(name string) Path { return join(imagesDir, name) }

// ImageFile is the file called file in the image called name.
func ImageFile(name, file string) Path { return join(imagesDir, name, file) }

// VMDir is the directory that holds everything of the VM called vm.
func VMDir(vm string) Path { return join(vmsDir, vm) }

// VMDisk is the active disk image of the VM called vm.
func VMDisk(vm string) Path { return join(vmsDir, vm, diskFile) }

// VMActivity is the directory of the VM's activity record.
func VMActivity(vm string) Path { return join(vmsDir, vm, "activity") }

// CheckpointsDir holds every checkpoint of the VM called vm.
func CheckpointsDir(vm string) Path { return join(vmsDir, vm, checkpointsDir) }

// CheckpointDir is the directory of checkpoint id of the VM called vm.
func CheckpointDir(vm, id string) Path { return join(vmsDir, vm, checkpointsDir, id) }

// CheckpointFile is a file (disk, memory snapshot part) of checkpoint id.
func CheckpointFile(vm, id, file string) Path {
	return join(vmsDir, vm, checkpointsDir, id, file)
}

// SuspendDir is the sleep slot of the VM called vm.
func SuspendDir(vm string) Path { return join(vmsDir, vm, suspendDir) }

// Join appends slash-separated elements to p.
func (p Path) Join(elem ...string) Path { return join(append([]string{string(p)}, elem...)...) }

// Dir is the parent of p ("" for a top-level entry).
func (p Path) Dir() Path {
	d := path.Dir(string(p))
	if d == "." {
		return ""
	}
	return Path(d)
}

// Base is the last element of p.
func (p Path) Base() string { return path.Base(string(p)) }

func (p Path) String() string { return string(p) }

func join(elem ...string) Path { return Path(strings.Join(elem, "/")) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$`)

// ValidName reports whether s can name an image, a VM or a checkpoint: one
// path element of letters, digits and ._@+- (not starting with a dot or a
// dash), at most 128 bytes. Callers check names with it where users type
// them; Volume methods check every element of a Path the same way, so no
// Path can leave the volume.
func ValidName(s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("invalid name %q: use letters, digits and ._@+- (not first), at most 128", s)
	}
	return nil
}

// Validate checks that p is relative, clean and made of valid names.
func (p Path) Validate() error {
	if p == "" {
		return fmt.Errorf("empty volume path")
	}
	for _, e := range strings.Split(string(p), "/") {
		if err := ValidName(e); err != nil {
			return fmt.Errorf("volume path %q: %w", p, err)
		}
	}
	return nil
}

// hostPath maps p under root after validating it.
func hostPath(root string, p Path) (string, error) {
	if err := p.Validate(); err != nil {
		return "", err
	}
	return filepath.Join(root, filepath.FromSlash(string(p))), nil
}
