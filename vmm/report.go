package vmm

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/cgroup"
)

// ConfineReport is what den doctor says about confining VMMs here.
type ConfineReport struct {
	// CgroupVersion is 2 or 1, 0 with no usable cgroups.
	CgroupVersion int `json:"cgroup_version"`
	// Seccomp: the kernel filters system calls (Cloud Hypervisor's
	// default, QEMU's -sandbox).
	Seccomp bool `json:"seccomp"`
	// LandlockABI is the kernel's landlock ABI version, 0 without.
	LandlockABI int `json:"landlock_abi"`
	// QEMUSandbox: the QEMU binary was built with -sandbox (seccomp).
	QEMUSandbox bool `json:"qemu_sandbox"`
	// User is the VMM user; Unprivileged says it exists, so VMMs run
	// as it rather than as root.
	User         string `json:"user"`
	Unprivileged bool   `json:"unprivileged"`
}

// Report looks at this host: cgroups, seccomp, landlock, whether
// qemuBinary ("" to skip) has -sandbox, and whether user exists.
func Report(ctx context.Context, qemuBinary, user string) ConfineReport {
	if user == "" {
		user = DefaultUser
	}
	r := ConfineReport{User: user}
	if h, err := cgroup.Detect(); err == nil {
		r.CgroupVersion = h.Version()
	}
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		r.Seccomp = strings.Contains(string(data), "\nSeccomp:")
	}
	if abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION); errno == 0 {
		r.LandlockABI = int(abi)
	}
	if qemuBinary != "" {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, qemuBinary, "-help").Output()
		r.QEMUSandbox = strings.Contains(string(out), "\n-sandbox ")
	}
	_, err := LookupUser(user)
	r.Unprivileged = err == nil
	return r
}
