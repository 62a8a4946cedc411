package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/network"
	"github.com/denhq/den/vmm"
	"github.com/denhq/den/vmm/cloudhypervisor"
	"github.com/denhq/den/vmm/qemu"
)

// check is one line of `den doctor`.
type check struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok, warn, fail
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:      "doctor",
		Usage:     "show what this host offers den, and what to do about what is missing",
		UsageText: "den doctor [--state-dir DIR] [--socket PATH] [--json]",
		Description: `Checks KVM, Cloud Hypervisor, QEMU, FUSE, TAP devices, free disk, how VMMs
are confined (cgroups, seccomp and sandbox, the unprivileged VMM user), and
the host's memory: the daemon's memory budget and its use (committed,
budget, free, running VMs) when the daemon answers on --socket, the
host's RAM and the default budget otherwise.
Exits non-zero when den cannot run a VM here at all.

Examples:
   den doctor
   den doctor --json | jq '.[] | select(.status != "ok")'`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Value: "/var/lib/den", Usage: "den's state directory (for the free-disk check)"},
			&cli.BoolFlag{Name: "json", Usage: "print the checks as JSON"},
			socketFlag(),
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			checks := runChecks(c.Context, c.String("state-dir"))
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			checks = append(checks, checkMemory(c.Context, cl), checkNetwork(c.Context, cl))
			checks = append(checks, checkConfinement(c.Context, cl)...)
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				if err := enc.Encode(checks); err != nil {
					return err
				}
			} else {
				for _, ch := range checks {
					fmt.Fprintf(c.App.Writer, "%-5s %-17s %s\n", ch.Status, ch.Name, ch.Detail)
					if ch.Fix != "" {
						fmt.Fprintf(c.App.Writer, "%-5s %-17s -> %s\n", "", "", ch.Fix)
					}
				}
			}
			for _, ch := range checks {
				if ch.Status == "fail" && (ch.Name == "vmm") {
					return cli.Exit("", 1)
				}
			}
			return nil
		},
	}
}

func runChecks(ctx context.Context, stateDir string) []check {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	kvm := vmm.DetectKVM()
	checks := []check{checkKVM(kvm)}
	ch, chOK := checkCloudHypervisor(ctx)
	q, qOK := checkQEMU(ctx)
	checks = append(checks, ch, q)
	vm := check{Name: "vmm", Status: "ok"}
	switch {
	case chOK && kvm.Usable:
		vm.Detail = "VMs run under Cloud Hypervisor with KVM"
	case qOK:
		vm.Detail = "VMs run under QEMU with " + strings.ToUpper(kvm.Accelerator())
		if !kvm.Usable {
			vm.Status = "warn"
			vm.Fix = "TCG is functional but slow; for speed use a host whose KVM boots stock kernels"
		}
	default:
		vm = check{Name: "vmm", Status: "fail", Detail: "no VMM can run here", Fix: "install qemu-system-x86 (make deps)"}
	}
	checks = append(checks, vm, checkFUSE(), checkTAP(), checkDisk(stateDir))
	return checks
}

func checkKVM(s vmm.KVMStatus) check {
	c := check{Name: "kvm", Detail: s.Reason}
	switch {
	case s.Usable:
		c.Status = "ok"
	case s.PVM:
		c.Status = "warn"
		c.Fix = "QEMU with TCG is used; run on a host with VMX/SVM KVM for full speed"
	default:
		c.Status = "warn"
		c.Fix = "load kvm_intel or kvm_amd, or run on a host with virtualization; QEMU with TCG is used meanwhile"
	}
	return c
}

func checkCloudHypervisor(ctx context.Context) (check, bool) {
	c := check{Name: "cloud-hypervisor"}
	bin, err := cloudhypervisor.FindBinary()
	if err != nil {
		c.Status, c.Detail = "warn", "not found (DEN_CH_BINARY, PATH)"
		c.Fix = "make deps fetches the pinned " + cloudhypervisor.PinnedVersion + " where the network allows; QEMU is used meanwhile"
		return c, false
	}
	ver, err := cloudhypervisor.Version(ctx, bin)
	if err != nil {
		c.Status, c.Detail = "warn", fmt.Sprintf("%s does not run: %v", bin, err)
		c.Fix = "check the binary (static release from the Cloud Hypervisor release page)"
		return c, false
	}
	c.Status, c.Detail = "ok", fmt.Sprintf("%s %s", bin, ver)
	if !strings.Contains(ver, strings.TrimPrefix(cloudhypervisor.PinnedVersion, "v")) {
		c.Status = "warn"
		c.Detail += " (pinned: " + cloudhypervisor.PinnedVersion + ")"
		c.Fix = "den is tested with " + cloudhypervisor.PinnedVersion
	}
	return c, true
}

func checkQEMU(ctx context.Context) (check, bool) {
	c := check{Name: "qemu"}
	bin, err := qemu.FindBinary()
	if err != nil {
		c.Status, c.Detail, c.Fix = "warn", "qemu-system-x86_64 not found", "apt-get install qemu-system-x86 (make deps)"
		return c, false
	}
	ver, err := qemu.Version(ctx, bin)
	if err != nil {
		c.Status, c.Detail, c.Fix = "warn", fmt.Sprintf("%s does not run: %v", bin, err), "reinstall qemu-system-x86"
		return c, false
	}
	c.Status, c.Detail = "ok", fmt.Sprintf("%s %s", bin, ver)
	return c, true
}

func checkFUSE() check {
	c := check{Name: "fuse"}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		c.Status, c.Detail, c.Fix = "fail", fmt.Sprintf("/dev/fuse: %v", err), "modprobe fuse, and run den as root"
		return c
	}
	f.Close()
	fm, err := exec.LookPath("fusermount3")
	if err != nil {
		if fm, err = exec.LookPath("fusermount"); err != nil {
			c.Status, c.Detail, c.Fix = "fail", "/dev/fuse ok, fusermount not found", "apt-get install fuse3 (make deps)"
			return c
		}
	}
	c.Status, c.Detail = "ok", "/dev/fuse and "+fm
	return c
}

// checkTAP creates a non-persistent TAP device and lets it vanish on close.
func checkTAP() check {
	c := check{Name: "tap"}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		c.Status, c.Detail, c.Fix = "warn", fmt.Sprintf("/dev/net/tun: %v", err), "modprobe tun and run as root; VMs fall back to user-mode networking"
		return c
	}
	defer unix.Close(fd)
	var ifr [unix.IFNAMSIZ + 64]byte
	copy(ifr[:], "dendoctor%d")
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
		c.Status, c.Detail, c.Fix = "warn", fmt.Sprintf("cannot create a TAP device: %v", errno), "run as root (CAP_NET_ADMIN); VMs fall back to user-mode networking"
		return c
	}
	if err := network.Unavailable(); err != nil {
		c.Status, c.Detail, c.Fix = "warn", "TAP devices can be created, but "+err.Error(), "apt-get install nftables (make deps); meanwhile QEMU VMs fall back to user-mode networking and Cloud Hypervisor VMs have none"
		return c
	}
	c.Status, c.Detail = "ok", "TAP devices can be created and nft is there: every VM gets a TAP, a routed /30, NAT and its egress policy"
	return c
}

// checkNetwork says how the running daemon's VMs reach the network.
func checkNetwork(ctx context.Context, cl *api.Client) check {
	c := check{Name: "network"}
	info, err := cl.Info(ctx)
	if err != nil {
		c.Status, c.Detail = "ok", "daemon not reachable on "+cl.Socket()+"; den daemon --net auto gives VMs TAPs where the tap check passes"
		return c
	}
	c.Status, c.Detail = "ok", info.Network
	if !strings.HasPrefix(info.Network, "tap") {
		c.Status, c.Fix = "warn", "VMs have no TAP of their own (no egress policy, no inbound): see the tap check"
	}
	if info.HTTP != "" {
		c.Detail += "; VM URLs on " + info.HTTP
	}
	return c
}

func checkDisk(stateDir string) check {
	c := check{Name: "disk"}
	dir := stateDir
	for {
		if _, err := os.Stat(dir); err == nil || dir == "/" {
			break
		}
		dir = filepath.Dir(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		c.Status, c.Detail = "warn", fmt.Sprintf("statfs %s: %v", dir, err)
		return c
	}
	free := st.Bavail * uint64(st.Bsize)
	c.Detail = fmt.Sprintf("%.1f GiB free under %s", float64(free)/(1<<30), stateDir)
	c.Status = "ok"
	if free < 10<<30 {
		c.Status, c.Fix = "warn", "VM disks, memory snapshots and the volume cache need space: keep 10 GiB or more free"
	}
	return c
}

// checkMemory reports the daemon's memory budget and its use, or, with
// no daemon answering, the host's RAM and the budget a daemon would take.
func checkMemory(ctx context.Context, cl *api.Client) check {
	c := check{Name: "memory", Status: "ok"}
	gib := fmtMemory
	total, avail, pressure := int64(-1), int64(-1), -1.0
	if p, err := machine.HostPressure(); err == nil {
		total, avail, pressure = p.Total, p.Available, p.SomeAvg10
	}
	host := "host RAM unknown"
	if total > 0 {
		host = fmt.Sprintf("host %s, %s available", gib(total), gib(avail))
		if pressure >= 0 {
			host += fmt.Sprintf(", pressure %.1f%%", pressure)
		}
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := cl.Info(ictx)
	switch {
	case err != nil || info.Memory == nil:
		c.Detail = "daemon not reachable on " + cl.Socket() + "; " + host
		if total > 0 {
			c.Detail += "; default budget " + gib(machine.DefaultBudget(total))
		}
	case info.Memory.BudgetBytes < 0:
		mi := info.Memory
		c.Status = "warn"
		c.Detail = memoryLine(mi) + "; " + host
		c.Fix = "without a budget, VMs whose guests touch their memory can meet the host's OOM killer: den daemon --memory-budget 80%"
	default:
		mi := info.Memory
		c.Detail = memoryLine(mi) + "; " + host + "; guest RAM: " + info.GuestRAM
		if strings.Contains(info.GuestRAM, "not a tmpfs") || strings.Contains(info.GuestRAM, "disk") {
			c.Status = "warn"
			c.Fix = "guest RAM on a disk filesystem: run den daemon as root so that it can mount a tmpfs for it"
		}
		if mi.HostTotalBytes > 0 && mi.BudgetBytes > mi.HostTotalBytes {
			c.Status = "warn"
			c.Fix = "the budget is more than the host's RAM: lower --memory-budget"
		}
	}
	return c
}

// memoryLine is the budget and its use in one line, for den info and den
// doctor: "1.2 GiB committed of a 18.8 GiB budget, 17.6 GiB free, 3
// running VMs (128 MiB each for the VMM)".
func memoryLine(mi *api.MemoryInfo) string {
	var s string
	if mi.BudgetBytes < 0 {
		s = fmt.Sprintf("%s committed, no budget (--memory-budget off)", fmtMemory(mi.CommittedBytes))
	} else {
		s = fmt.Sprintf("%s committed of a %s budget, %s free", fmtMemory(mi.CommittedBytes), fmtMemory(mi.BudgetBytes), fmtMemory(mi.FreeBytes))
	}
	s += fmt.Sprintf(", %d running VMs", mi.Running)
	if mi.Starting > 0 {
		s += fmt.Sprintf(" and %d starting", mi.Starting)
	}
	return s + fmt.Sprintf(" (%s each for the VMM)", fmtMemory(mi.VMMOverheadBytes))
}

// fmtMemory prints memory for people: 7.5 GiB, 224 MiB.
func fmtMemory(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", max(b, 0)>>20)
}
