package qemu

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/denhq/den/vmm"
)

// sandboxArg is QEMU's seccomp filter: no obsolete system calls, no
// set*uid, no fork or exec (snapshots migrate through fds, never exec:),
// no scheduler or affinity changes.
const sandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// diskFDs are the fds (in the QEMU process) of disk i, which the daemon
// opens and passes (vmm.ProcessSpec.ExtraFiles): QEMU never opens a disk
// by path, so its user needs no access to any disk. QEMU's block layer
// opens a disk read-only before read-write, and an fd set hands out only
// an fd of the access mode asked for: each disk has a read-only fd and,
// unless read-only, a read-write one.
func diskFDs(i int) (ro, rw int) { return 3 + 2*i, 4 + 2*i }

// bootFD is the fd (in the QEMU process) of the kernel (i 0) or the
// initramfs (i 1), after the disks' and the TAPs' (inheritedFiles): the
// image directory may be where QEMU's user cannot look (a home dir).
func bootFD(cfg vmm.Config, i int) int { return tapFD(cfg, len(cfg.Net)) + i }

// fdPath names an inherited fd as a path QEMU opens (the magic link
// reopens the file itself, whatever the directories above it allow).
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// TCGCacheMiB bounds TCG's translation cache (QEMU's default is 1 GiB,
// filled as the guest runs more code): a debian guest running Ansible
// took its VMM past guest RAM + 256 MiB and its cgroup killed it. The
// VMM's cgroup allows for it (machine's cgroup limits).
const TCGCacheMiB = 128

// tapFD is the fd (in the QEMU process) of net device i's TAP, which
// the daemon opens and passes after the disks' (inheritedFiles).
func tapFD(cfg vmm.Config, i int) int { return 3 + 2*len(cfg.Disks) + i }

// buildArgs is the QEMU command line for cfg: a microvm with virtio-mmio
// devices, RAM in a shared file, QMP and the agent port on unix sockets,
// the serial console into a file, disks on inherited fds (an fd set
// each), the seccomp sandbox on, and vCPUs stopped at start (-S).
func buildArgs(cfg vmm.Config, rd vmm.RunDir, ramFile, accel string, incoming bool) []string {
	memMiB := cfg.MemoryBytes >> 20
	args := []string{
		"-name", "den",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-machine", "microvm,memory-backend=mem,rtc=on,x-option-roms=off",
		"-m", fmt.Sprintf("%dM", memMiB),
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=on", memMiB, ramFile),
		"-smp", strconv.Itoa(cfg.CPUs),
		"-qmp", "unix:" + rd.APISocket() + ",server=on,wait=off",
		"-chardev", "file,id=con,path=" + rd.ConsoleLog() + ",append=on",
		"-serial", "chardev:con",
		"-chardev", "socket,id=agent,path=" + rd.AgentSocket() + ",server=on,wait=off",
		"-device", "virtio-serial-device",
		"-device", "virtserialport,chardev=agent,name=" + AgentPortName,
		"-device", "virtio-rng-device",
		"-kernel", fdPath(bootFD(cfg, 0)),
		"-append", kernelCmdline(cfg.Cmdline, accel),
		"-S",
		"-sandbox", sandboxArg,
	}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", fmt.Sprintf("tcg,thread=multi,tb-size=%d", TCGCacheMiB), "-cpu", "max")
	}
	if cfg.Initramfs != "" {
		args = append(args, "-initrd", fdPath(bootFD(cfg, 1)))
	}
	for i, d := range cfg.Disks {
		id := driveID(d, i)
		// No image locking: den runs one VMM per disk (a lock per VM),
		// and QEMU's OFD locks on a FUSE volume can outlive a migration's
		// release and refuse the resume ("Failed to get shared write lock").
		set := i + 1
		ro, rw := diskFDs(i)
		args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s-ro", ro, set, id))
		if !d.ReadOnly {
			args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s-rw", rw, set, id))
		}
		drive := fmt.Sprintf("id=%s,file=/dev/fdset/%d,format=raw,if=none,discard=unmap,cache=writeback,file.locking=off", id, set)
		if d.ReadOnly {
			drive += ",readonly=on"
		}
		args = append(args, "-drive", drive, "-device", "virtio-blk-device,drive="+id)
	}
	for i, n := range cfg.Net {
		id := n.ID
		if id == "" {
			id = fmt.Sprintf("net%d", i)
		}
		if n.Tap != "" {
			// The TAP on an fd the daemon opened (tapFD): QEMU's user
			// needs no access to /dev/net/tun.
			args = append(args, "-netdev", fmt.Sprintf("tap,id=%s,fd=%d", id, tapFD(cfg, i)))
		} else {
			args = append(args, "-netdev", "user,id="+id)
		}
		dev := "virtio-net-device,netdev=" + id
		if n.MAC != "" {
			dev += ",mac=" + n.MAC
		}
		args = append(args, "-device", dev)
	}
	if incoming {
		args = append(args, "-incoming", "defer")
	}
	return args
}

// driveID is the QEMU drive id (the block backend's name) of disk i.
func driveID(d vmm.Disk, i int) string {
	if d.ID != "" {
		return d.ID
	}
	return fmt.Sprintf("disk%d", i)
}

// kernelCmdline adds what the accelerator needs: under TCG the guest
// must be told its TSC frequency or it hangs calibrating on a busy host.
func kernelCmdline(cmdline, accel string) string {
	if accel != "kvm" && !strings.Contains(cmdline, "tsc_early_khz=") {
		cmdline = strings.TrimSpace(cmdline + " tsc_early_khz=" + strconv.Itoa(hostTSCkHz()))
	}
	return cmdline
}

// hostTSCkHz reads the host CPU's clock from /proc/cpuinfo, 2 GHz if it
// cannot: any plausible value keeps the guest from calibrating.
func hostTSCkHz() int {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			k, val, ok := strings.Cut(line, ":")
			if ok && strings.TrimSpace(k) == "cpu MHz" {
				if mhz, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil && mhz > 0 {
					return int(mhz * 1000)
				}
			}
		}
	}
	return 2000000
}
