package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/denhq/den/api"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/qemu"
)

// checkConfinement says how VMMs are confined on this host: cgroups,
// seccomp and landlock, QEMU's sandbox, and, from the running daemon,
// whether VMMs run unprivileged and are cut off the host's addresses.
func checkConfinement(ctx context.Context, cl *api.Client) []check {
	bin, _ := qemu.FindBinary()
	r := vmm.Report(ctx, bin, "")
	cg := check{Name: "cgroups", Status: "ok"}
	switch r.CgroupVersion {
	case 2:
		cg.Detail = "cgroup v2: each VMM gets memory.max, cpu.max, pids.max and io.weight"
	case 1:
		cg.Detail = "cgroup v1 (no unified hierarchy with controllers): each VMM gets memory, cpu, pids (and blkio) limits"
	default:
		cg.Status, cg.Detail, cg.Fix = "warn", "no usable cgroups: VMMs run without memory or CPU limits", "mount cgroup2 at /sys/fs/cgroup (every current distribution does)"
	}
	sb := check{Name: "sandbox", Status: "ok"}
	var parts []string
	if r.Seccomp {
		parts = append(parts, "seccomp")
	}
	if r.LandlockABI > 0 {
		parts = append(parts, fmt.Sprintf("landlock ABI %d", r.LandlockABI))
	}
	if r.QEMUSandbox {
		parts = append(parts, "qemu -sandbox")
	}
	sb.Detail = "the kernel has " + strings.Join(parts, ", ")
	if !r.Seccomp || (bin != "" && !r.QEMUSandbox) {
		sb.Status, sb.Fix = "warn", "VMMs run without a system call filter: use a kernel with seccomp and a QEMU built with it"
	}
	priv := check{Name: "vmm user"}
	info, err := cl.Info(ctx)
	switch {
	case err != nil:
		priv.Status = "ok"
		priv.Detail = fmt.Sprintf("daemon not reachable on %s; VMMs will run as %q", cl.Socket(), r.User)
		if !r.Unprivileged {
			priv.Detail += " (made when the daemon starts)"
		}
	case info.Confinement == nil || info.Confinement.User == "":
		priv.Status, priv.Detail = "warn", "VMMs run as root"
		if info.Confinement != nil && info.Confinement.Missing != "" {
			priv.Detail += ": " + info.Confinement.Missing
		}
		priv.Fix = "den daemon --vmm-user den-vm (useradd must work)"
	default:
		c := info.Confinement
		priv.Status, priv.Detail = "ok", fmt.Sprintf("VMMs run unprivileged as %q, each in a cgroup v%d", c.User, c.CgroupVersion)
		if c.CgroupVersion == 0 {
			priv.Status, priv.Detail = "warn", fmt.Sprintf("VMMs run unprivileged as %q, without cgroups", c.User)
		}
		if c.Guarded {
			priv.Detail += "; their packets to the host's own addresses are dropped"
		} else if !strings.HasPrefix(info.Network, "tap") {
			priv.Status = "warn"
			priv.Fix = "install nftables: without it a guest on QEMU's user-mode network reaches the host's loopback services through 10.0.2.2"
		}
	}
	return []check{cg, sb, priv}
}
