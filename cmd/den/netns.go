package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// envNetns marks a daemon that entered its network namespace already.
const envNetns = "DEN_NETNS_ENTERED"

// enterNetns runs the daemon in a named network namespace (ip netns add
// NAME): its TAPs, VM subnet, nftables table and listeners live there,
// its mounts do not move. The thread enters the namespace and execs den
// again, so that every thread of the new process is in it (a namespace
// is per thread). Only the mount namespace of the caller is kept, unlike
// `ip netns exec`, so that the volume den mounts stays visible.
func enterNetns(name string) error {
	if name == "" {
		return nil
	}
	path := name
	if filepath.Base(name) == name {
		path = filepath.Join("/var/run/netns", name)
	}
	if os.Getenv(envNetns) == path {
		same, err := sameNetns(path)
		if err != nil {
			return err
		}
		if !same {
			return fmt.Errorf("--netns %s: the daemon is not in it after entering it", name)
		}
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--netns %s: %w (make it with: ip netns add %s)", name, err, name)
	}
	defer f.Close()
	runtime.LockOSThread() // never unlocked: this thread execs
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("--netns %s: enter: %w", name, err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--netns %s: %w", name, err)
	}
	env := append(os.Environ(), envNetns+"="+path)
	return fmt.Errorf("--netns %s: exec: %w", name, syscall.Exec(exe, os.Args, env))
}

// sameNetns says whether this process is in the namespace at path.
func sameNetns(path string) (bool, error) {
	var want, have unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return false, fmt.Errorf("netns %s: %w", path, err)
	}
	if err := unix.Stat("/proc/self/ns/net", &have); err != nil {
		return false, fmt.Errorf("netns: %w", err)
	}
	return want.Dev == have.Dev && want.Ino == have.Ino, nil
}
