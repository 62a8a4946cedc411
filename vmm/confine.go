package vmm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/cgroup"
)

// DefaultUser is the unprivileged user VMMs run as.
const DefaultUser = "den-vm"

// ShimVerb is the hidden first argument that makes the den binary the
// VMM's launcher on cgroup v1 (see RunShim).
const ShimVerb = "__vmm-exec"

// User is an unprivileged user a VMM runs as.
type User struct {
	Name string
	UID  int
	GID  int
	// Groups are its supplementary groups (kvm, for /dev/kvm); all
	// others are dropped.
	Groups []int
}

// LookupUser finds a user by name.
func LookupUser(name string) (*User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("look up user %s: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("look up user %s: %w", name, err)
	}
	out := &User{Name: name, UID: uid, GID: gid}
	gids, _ := u.GroupIds()
	for _, g := range gids {
		if n, err := strconv.Atoi(g); err == nil && n != gid {
			out.Groups = append(out.Groups, n)
		}
	}
	return out, nil
}

// groupArg is the shim's form of u's supplementary groups: "-" for none.
func (u *User) groupArg() string {
	if len(u.Groups) == 0 {
		return "-"
	}
	s := make([]string, len(u.Groups))
	for i, g := range u.Groups {
		s[i] = strconv.Itoa(g)
	}
	return strings.Join(s, ",")
}

// EnsureUser returns the user name, making it a system user without a
// home or a login shell when it is missing (in group kvm where the host
// has one: /dev/kvm); made says it was.
func EnsureUser(name string) (u *User, made bool, err error) {
	if u, err := LookupUser(name); err == nil {
		return u, false, nil
	}
	args := []string{"--system", "--no-create-home", "--shell", "/usr/sbin/nologin"}
	if _, err := user.LookupGroup("kvm"); err == nil {
		args = append(args, "--groups", "kvm")
	}
	out, err := exec.Command("useradd", append(args, name)...).CombinedOutput()
	if err != nil {
		return nil, false, fmt.Errorf("make user %s: useradd: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	u, err = LookupUser(name)
	return u, true, err
}

// Own gives u the paths that exist (a VMM's run dir, its RAM file):
// owner u, group u's; a directory is made 0700 (u's own, whatever umask
// made it), a file keeps its mode. Missing paths are skipped.
func (u *User) Own(paths ...string) error {
	for _, p := range paths {
		st, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil && st.IsDir() {
			err = os.Chmod(p, 0o700)
		}
		if err == nil {
			err = os.Lchown(p, u.UID, u.GID)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("give %s to %s: %w", p, u.Name, err)
		}
	}
	return nil
}

// Confine is how a VMM process is confined: the user it runs as and the
// control group it starts in. The zero value confines nothing.
type Confine struct {
	// User the VMM runs as (all supplementary groups dropped); nil:
	// the caller's.
	User *User
	// Cgroup the VMM is started in (never moved there after); nil: the
	// caller's.
	Cgroup cgroup.Group
	// Shim is the executable that, run with ShimVerb first, joins v1
	// groups, drops privileges and execs the VMM (RunShim); empty:
	// this executable.
	Shim string
}

// command is the exec.Cmd that starts binary with args under c: v2 and
// no group clone straight into the group with the user's credentials;
// v1 goes through the shim. The returned closer releases the group's
// directory fd after the start.
func (c Confine) command(binary string, args []string) (*exec.Cmd, func(), error) {
	attr := &syscall.SysProcAttr{Setsid: true}
	done := func() {}
	if c.Cgroup != nil && c.Cgroup.Version() == 1 {
		shim := c.Shim
		if shim == "" {
			exe, err := os.Executable()
			if err != nil {
				return nil, done, fmt.Errorf("find the vmm shim: %w", err)
			}
			shim = exe
		}
		uid, gid, groups := -1, -1, "-"
		if c.User != nil {
			uid, gid, groups = c.User.UID, c.User.GID, c.User.groupArg()
		}
		sargs := []string{ShimVerb, strconv.Itoa(uid), strconv.Itoa(gid), groups}
		sargs = append(sargs, c.Cgroup.ProcsFiles()...)
		sargs = append(sargs, "--", binary)
		cmd := exec.Command(shim, append(sargs, args...)...)
		cmd.SysProcAttr = attr
		return cmd, done, nil
	}
	cmd := exec.Command(binary, args...)
	cmd.SysProcAttr = attr
	if c.User != nil {
		groups := []uint32{}
		for _, g := range c.User.Groups {
			groups = append(groups, uint32(g))
		}
		attr.Credential = &syscall.Credential{Uid: uint32(c.User.UID), Gid: uint32(c.User.GID), Groups: groups}
	}
	if c.Cgroup != nil {
		fd, err := unix.Open(c.Cgroup.Dirs()[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, done, fmt.Errorf("open cgroup %s: %w", c.Cgroup.Name(), err)
		}
		attr.UseCgroupFD, attr.CgroupFD = true, fd
		done = func() { unix.Close(fd) }
	}
	return cmd, done, nil
}

// RunShim is the VMM launcher on cgroup v1, where a process cannot be
// cloned into a group: when os.Args[1] is ShimVerb it writes its own pid
// into each v1 cgroup.procs named, drops to the VMM user (its
// supplementary groups only, no new privileges) and execs the VMM, keeping its
// pid, so the VMM runs in its group from its first instruction. Any
// other command line returns at once. den's main calls it first thing;
// so do test binaries that start confined VMMs.
//
//	den __vmm-exec UID GID GROUPS|- PROCS-FILE... -- BINARY ARG...
func RunShim() {
	if len(os.Args) < 2 || os.Args[1] != ShimVerb {
		return
	}
	if err := shim(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "den vmm shim: "+err.Error())
		os.Exit(127)
	}
}

func shim(args []string) error {
	sep := -1
	for i, a := range args {
		if a == "--" {
			sep = i
			break
		}
	}
	if sep < 3 || sep+1 >= len(args) {
		return errors.New("usage: " + ShimVerb + " UID GID GROUPS|- PROCS-FILE... -- BINARY ARG...")
	}
	uid, err1 := strconv.Atoi(args[0])
	gid, err2 := strconv.Atoi(args[1])
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("bad uid or gid: %w", err)
	}
	var groups []int
	if args[2] != "-" {
		for _, g := range strings.Split(args[2], ",") {
			n, err := strconv.Atoi(g)
			if err != nil {
				return fmt.Errorf("bad group %q: %w", g, err)
			}
			groups = append(groups, n)
		}
	}
	pid := strconv.Itoa(os.Getpid())
	for _, f := range args[3:sep] {
		if err := os.WriteFile(f, []byte(pid), 0); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	if uid >= 0 {
		// Go applies these to every thread of the process.
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("drop groups: %w", err)
		}
		if err := syscall.Setgid(gid); err != nil {
			return fmt.Errorf("setgid %d: %w", gid, err)
		}
		if err := syscall.Setuid(uid); err != nil {
			return fmt.Errorf("setuid %d: %w", uid, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no new privileges: %w", err)
	}
	bin := args[sep+1]
	argv := append([]string{bin}, args[sep+2:]...)
	if err := syscall.Exec(bin, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", bin, err)
	}
	return nil
}
