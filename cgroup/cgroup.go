// Package cgroup puts each VMM in a control group of its own, on cgroup v2 or v1.
//
// A Hierarchy is the host's layout (Detect): the unified cgroup v2 tree,
// or the v1 controllers memory, cpu, cpuacct, pids and blkio mounted one
// by one. Both make a Group per VM under a parent named den, with the
// same Limits, read back the same Stats, and take a process in the same
// ways: v2 at clone time through a directory fd (CLONE_INTO_CGROUP), v1
// by the process writing its own pid into each controller's
// cgroup.procs before it execs (see vmm's shim).
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Root is where the cgroup filesystems are mounted.
const Root = "/sys/fs/cgroup"

// Parent is the name of den's group under which each VM gets its own (a
// slice on v2, as systemd names them).
const (
	ParentV1 = "den"
	ParentV2 = "den.slice"
)

// Limits are the resources one group may use; a zero field sets no
// limit.
type Limits struct {
	// MemoryMax is the most memory (bytes) the group's processes may
	// use: the guest's RAM and the VMM's own.
	MemoryMax int64 `json:"memory_max,omitempty"`
	// CPUQuota is the CPU time allowed, in cores (1.5: one and a half
	// cores' worth per period).
	CPUQuota float64 `json:"cpu_quota,omitempty"`
	// PidsMax bounds the group's processes and threads.
	PidsMax int64 `json:"pids_max,omitempty"`
	// IOWeight is the group's share of block I/O (v2 io.weight 1-10000,
	// mapped to v1 blkio.weight 10-1000); hosts without a weight-aware
	// I/O scheduler have no such file and the weight is skipped.
	IOWeight int `json:"io_weight,omitempty"`
}

// Stats is what a group uses now.
type Stats struct {
	MemoryCurrent int64   `json:"memory_current"`
	MemoryMax     int64   `json:"memory_max"` // 0: no limit
	CPUSeconds    float64 `json:"cpu_seconds"`
	PidsCurrent   int64   `json:"pids_current"`
}

// Group is one VM's control group.
type Group interface {
	// Name is the group's name under den's parent.
	Name() string
	// Version is 1 or 2.
	Version() int
	// Dirs are the group's directories: one on v2, one per controller
	// on v1.
	Dirs() []string
	// ProcsFiles are the cgroup.procs files a process writes its pid to
	// to join the group (one per directory).
	ProcsFiles() []string
	// Add moves a running process into the group.
	Add(pid int) error
	// Limits reads the limits back from the kernel's files.
	Limits() (Limits, error)
	// Stats reads current use.
	Stats() (Stats, error)
	// Pids lists the processes in the group.
	Pids() ([]int, error)
	// Remove deletes the group, waiting (bounded by ctx) while the
	// processes in it drain; a group already gone is no error.
	Remove(ctx context.Context) error
}

// Hierarchy makes and finds groups on one host layout.
type Hierarchy interface {
	// Version is 1 or 2.
	Version() int
	// Create makes (or reuses) the group name with limits set.
	Create(name string, l Limits) (Group, error)
	// Open returns the group name, which may not exist.
	Open(name string) Group
}

// ErrNoCgroups is returned by Detect on a host with neither layout.
var ErrNoCgroups = errors.New("no usable cgroup hierarchy (neither cgroup v2 nor the v1 memory controller is mounted)")

// Detect finds the host's layout under Root: cgroup v2 when the unified
// hierarchy is mounted at Root itself, else v1 when its memory
// controller is.
func Detect() (Hierarchy, error) {
	if _, err := os.Stat(filepath.Join(Root, "cgroup.controllers")); err == nil {
		return NewV2(Root), nil
	}
	if _, err := os.Stat(filepath.Join(Root, "memory", "memory.limit_in_bytes")); err == nil {
		return NewV1(Root), nil
	}
	return nil, ErrNoCgroups
}

// checkName refuses names that are not one path element.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00\n") {
		return fmt.Errorf("cgroup name %q: not a single path element", name)
	}
	return nil
}

// writeFile writes one value to a cgroup interface file (never creating
// it: a file the kernel did not make is a controller that is absent).
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

// readInt reads a file holding one integer; "max" is 0 (no limit).
func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

// readPids reads a cgroup.procs file.
func readPids(path string) ([]int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// rmdirs removes dirs (deepest-first order is the caller's), retrying
// while processes that are exiting still hold them (EBUSY), until ctx
// ends. Missing directories are fine.
func rmdirs(ctx context.Context, dirs []string) error {
	interval := 2 * time.Millisecond
	for {
		var busy []string
		var errs []error
		for _, d := range dirs {
			err := os.Remove(d)
			switch {
			case err == nil, errors.Is(err, os.ErrNotExist):
			case errors.Is(err, errBusy):
				busy = append(busy, d)
			default:
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("remove cgroup: %w", errors.Join(errs...))
		}
		if len(busy) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove cgroup %s: processes still in it: %w", busy[0], ctx.Err())
		case <-time.After(interval):
		}
		interval = min(2*interval, 100*time.Millisecond)
		dirs = busy
	}
}
