package machine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// baseMeta is the meta.json of a warm base snapshot.
type baseMeta struct {
	Image   string    `json:"image"`
	Key     string    `json:"key"`
	CPUs    int       `json:"cpus"`
	Memory  int64     `json:"memory_bytes"`
	VMM     string    `json:"vmm"`
	Created time.Time `json:"created"`
	BootMS  int64     `json:"boot_ms"`
}

// baseKey names a warm base: everything the snapshot depends on (image,
// kernel and initramfs builds, sizes, VMM and accelerator, what of the
// host a restore needs, and the key the guest agent was told to
// accept).
func (b *bases) baseKey(vm registry.VM, sp spec) (string, error) {
	man, err := b.m.cfg.Images.Manifest()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n%d\n%d\n%s\n%s\n", sp.BaseImage, sp.Kernel, sp.KernelFile, sp.InitramfsFile, vm.CPUs, vm.MemoryBytes, vm.VMM, vm.Accel)
	// The base's disk and root filesystem are already the VM's size, so a
	// create grows nothing (a resize of the guest's filesystem costs more
	// than the restore).
	fmt.Fprintf(h, "disk=%d\n", vm.DiskBytes)
	// Hosts that cannot restore each other's snapshots (compat.go) make
	// warm bases of their own.
	fmt.Fprintf(h, "host=%s\n", b.m.compat.record(vm.VMM).compatKey())
	if sp.Net != nil {
		// A snapshot holds its network backend's state (QEMU's user-mode
		// network has some): TAP VMs restore from TAP bases only.
		h.Write([]byte("net=tap\n"))
	}
	for _, a := range man.Artifacts {
		fmt.Fprintf(h, "%s=%s\n", a.Name, a.Key)
	}
	h.Write([]byte(ssh.FingerprintSHA256(b.m.signer.PublicKey())))
	// What snapshotBase runs in the guest before the snapshot (settle=2:
	// root's login shell run once).
	h.Write([]byte("\nsettle=2\n"))
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// warmBase returns the warm base snapshot for a VM's image and sizes,
// booting and snapshotting it once if there is none: a directory on the
// volume holding a disk and a VMM snapshot, laid out like a checkpoint.
// Create then costs a restore, not a boot.
func (b *bases) warmBase(ctx context.Context, vm registry.VM, sp spec, progress Progress) (storage.Path, error) {
	key, err := b.baseKey(vm, sp)
	if err != nil {
		return "", err
	}
	dir := storage.ImageDir(vm.Image).Join("base-" + key)
	meta, err := b.m.vol.Path(dir.Join(checkpoint.MetaFile))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(meta); err == nil {
		return dir, nil
	}
	b.m.imageMu.Lock()
	defer b.m.imageMu.Unlock()
	if _, err := os.Stat(meta); err == nil {
		return dir, nil
	}
	progress("warming a base snapshot of image " + vm.Image + " (once per image and size)")
	start := time.Now()
	tmp := storage.ImageDir(vm.Image).Join("tmp-base-" + key)
	if err := b.m.vol.Remove(ctx, tmp); err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			_ = b.m.vol.Remove(context.Background(), tmp)
		}
	}()
	if err := b.m.vol.MkdirAll(ctx, tmp.Join(checkpoint.VMMDir)); err != nil {
		return "", err
	}
	if err := b.m.vol.Clone(ctx, storage.Path(sp.BaseImage), tmp.Join(checkpoint.DiskFile)); err != nil {
		return "", err
	}
	if err := b.m.disks.growFile(tmp.Join(checkpoint.DiskFile), vm.DiskBytes); err != nil {
		return "", err
	}
	if err := b.snapshotBase(ctx, vm, sp, tmp); err != nil {
		return "", fmt.Errorf("warm base of image %q: %w", vm.Image, err)
	}
	bm := baseMeta{Image: vm.Image, Key: key, CPUs: vm.CPUs, Memory: vm.MemoryBytes, VMM: vm.VMM,
		Created: time.Now().UTC(), BootMS: time.Since(start).Milliseconds()}
	tmpMeta, err := b.m.vol.Path(tmp.Join(checkpoint.MetaFile))
	if err != nil {
		return "", err
	}
	if err := atomicfile.WriteJSON(tmpMeta, bm, 0o600); err != nil {
		return "", err
	}
	if _, err := b.m.integrity.sealSmall(ctx, tmp); err != nil {
		return "", fmt.Errorf("warm base of image %q: %w", vm.Image, err)
	}
	if err := b.m.vol.Rename(ctx, tmp, dir); err != nil {
		return "", err
	}
	b.m.integrity.sealLater(dir, snapshotRef{}) // its local copy comes later (withBaseMemory)
	ok = true
	return dir, nil
}

// baseVMPrefix names the throwaway VM that boots a warm base (no VM name
// starts with "_").
const baseVMPrefix = "_base-"

// snapshotBase boots a throwaway VM on the base disk in dir, waits for
// its agent, flushes, and snapshots it into dir/vmm.
func (b *bases) snapshotBase(ctx context.Context, vm registry.VM, sp spec, dir storage.Path) error {
	bvm := vm
	bvm.Name = baseVMPrefix + dir.Base()
	bsp := sp
	bsp.Cmdline = b.m.launch.cmdline("den", "")
	cfg, err := b.m.launch.vmmConfigDisk(bvm, bsp, dir.Join(checkpoint.DiskFile))
	if err != nil {
		return err
	}
	// The throwaway VM runs on the network of the VM being made.
	if err := b.m.net.up(ctx, vm.Name, sp); err != nil {
		return err
	}
	rd := b.m.state.Run(bvm.Name)
	b.m.procs.stopRecorded(bvm.Name)
	if err := os.MkdirAll(rd.Path(), 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(rd.Path())
	if err := b.m.conf.start(bvm.Name, bvm.CPUs, bvm.MemoryBytes); err != nil {
		return err
	}
	// After the shutdown below: its cgroup and its RAM file.
	defer b.m.conf.drop(bvm.Name)
	defer b.m.ram.discard(bvm.Name)
	hv, err := b.m.vmms.newHypervisor(vm.VMM, rd)
	if err != nil {
		return err
	}
	if err := hv.Start(ctx); err != nil {
		return err
	}
	in := newInstance(bvm.Name, bvm.VMM, hv)
	defer func() {
		in.closeAgent()
		_ = hv.Shutdown(context.Background())
	}()
	if err := hv.Create(ctx, cfg); err != nil {
		return err
	}
	if err := hv.Boot(ctx); err != nil {
		return err
	}
	if _, err := b.m.agents.connectAgent(ctx, in, b.m.cfg.BootTimeout); err != nil {
		return fmt.Errorf("%w%s", err, consoleHint(rd))
	}
	c, err := b.m.agents.agentClient(ctx, in)
	if err != nil {
		return err
	}
	if _, err := c.GrowRoot(ctx, vm.DiskBytes); err != nil {
		return fmt.Errorf("grow the base's root filesystem: %w", err)
	}
	// Snapshot a settled system: with systemd, once its boot is over, so
	// that every VM created from the base does not redo the boot's work;
	// and with root's login shell run once, so that a VM's first login
	// or E2B command (bash -l -c) finds it in memory, not on disk.
	settle := "if command -v systemctl >/dev/null; then timeout 120 systemctl is-system-running --wait >/dev/null 2>&1; fi; " +
		"if [ -x /bin/bash ]; then /bin/bash -l -c true </dev/null >/dev/null 2>&1; fi; sync"
	if code, err := c.Exec(ctx, agent.ExecRequest{CmdLine: settle}); err != nil || code != 0 {
		return fmt.Errorf("settle the base guest: exit %d: %v", code, err)
	}
	in.closeAgent()
	snap, err := b.m.vol.Path(dir.Join(checkpoint.VMMDir))
	if err != nil {
		return err
	}
	if err := hv.Pause(ctx); err != nil {
		return err
	}
	if mk := b.m.snaps.keeper(hv); mk != nil {
		err = b.m.snaps.snapshotKept(ctx, vm.Name, mk, snap, "", "")
	} else {
		err = hv.Snapshot(ctx, snap)
	}
	if err != nil {
		return err
	}
	if err := b.m.compat.write(snap, bvm.VMM); err != nil {
		return err
	}
	return atomicfile.SyncTree(snap)
}

// baseImage makes sure the image's root disk is on the volume (imported
// once per image build) and returns its volume path and size.
func (b *bases) baseImage(ctx context.Context, name string, progress Progress) (storage.Path, int64, error) {
	art, err := b.rootFS(name)
	if err != nil {
		return "", 0, err
	}
	key := art.Key
	if len(key) > 16 {
		key = key[:16]
	}
	p := storage.ImageFile(name, "disk-"+key+".raw")
	host, err := b.m.vol.Path(p)
	if err != nil {
		return "", 0, err
	}
	if st, err := os.Stat(host); err == nil {
		return p, st.Size(), nil
	}
	b.m.imageMu.Lock()
	defer b.m.imageMu.Unlock()
	if st, err := os.Stat(host); err == nil {
		return p, st.Size(), nil
	}
	progress("importing image " + name + " onto the volume (once per image build)")
	if err := b.m.vol.MkdirAll(ctx, storage.ImageDir(name)); err != nil {
		return "", 0, err
	}
	tmp := storage.ImageFile(name, "import-"+key+".tmp")
	tmpHost, err := b.m.vol.Path(tmp)
	if err != nil {
		return "", 0, err
	}
	if err := sparse.Copy(b.m.cfg.Images.RootDisk(name), tmpHost); err != nil {
		_ = b.m.vol.Remove(ctx, tmp)
		return "", 0, fmt.Errorf("import image %q: %w", name, err)
	}
	if err := b.m.vol.Rename(ctx, tmp, p); err != nil {
		_ = b.m.vol.Remove(ctx, tmp)
		return "", 0, fmt.Errorf("import image %q: %w", name, err)
	}
	st, err := os.Stat(host)
	if err != nil {
		return "", 0, err
	}
	return p, st.Size(), nil
}

// kindRootFS is the manifest's kind of a root filesystem: the only
// artifacts a VM is made from.
const kindRootFS = "rootfs"

// checkImage refuses, before any work, an image name that is not a
// name (invalid) or not one of the image directory's built root
// filesystems (not found): kernels, the initramfs and other files of
// the directory are not images.
func (b *bases) checkImage(name string) error {
	_, err := b.rootFS(name)
	return err
}

// rootFS is the manifest entry of the named root filesystem, checked as
// checkImage says.
func (b *bases) rootFS(name string) (image.Artifact, error) {
	if err := ValidateImage(name); err != nil {
		return image.Artifact{}, err
	}
	man, err := b.m.cfg.Images.Manifest()
	if err != nil {
		return image.Artifact{}, fmt.Errorf("image %q: %w (build images with `make image`)", name, err)
	}
	art, ok := man.Artifact(name)
	if !ok || art.Kind != kindRootFS {
		var names []string
		for _, a := range man.Artifacts {
			if a.Kind == kindRootFS {
				names = append(names, a.Name)
			}
		}
		return image.Artifact{}, fmt.Errorf("no image named %q (images: %s): %w", name, strings.Join(names, ", "), ErrNotFound)
	}
	return art, nil
}

// bases imports images into base disks and makes their warm bases, the
// booted snapshots creates restore from (base.go).
type bases struct{ m *Manager }

// warmSource is where a new VM comes from when its image has a warm base
// (made now if missing): that base, verified, with the local copy of its
// memory if any (key is that copy's). With none to be had, or one found
// damaged (and dropped), it is cold, the image's disk, and the VM boots.
func (b *bases) warmSource(ctx context.Context, vm registry.VM, sp spec, cold bringUpFrom, progress Progress) (_ bringUpFrom, key string, err error) {
	warm, err := b.warmBase(ctx, vm, sp, progress)
	if err != nil {
		b.m.log.Warn("den: no warm base snapshot, booting instead", "image", vm.Image, "err", err)
		return cold, "", nil
	}
	ref, key := b.m.snaps.withBaseMemory(baseRef(warm, vm.Image))
	if err := b.m.integrity.verifyTraced(ctx, ref, b.m.vmmName); errors.Is(err, ErrDamaged) {
		b.dropBase(ctx, warm, err)
		return cold, "", nil
	} else if err != nil {
		return cold, "", err
	}
	return bringUpFrom{disk: warm.Join(checkpoint.DiskFile), memory: warm.Join(checkpoint.VMMDir), what: "the warm base of image " + vm.Image, ref: ref, spare: true}, key, nil
}
