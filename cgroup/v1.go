package cgroup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

var errBusy = syscall.EBUSY

// v1Controllers are the v1 hierarchies a VM's group spans; cpuacct
// counts the CPU time (it is often co-mounted with cpu, then one
// directory serves both).
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "blkio"}

// cfsPeriod is the CFS period den sets on v1 and v2 (the kernel's
// default): 100 ms.
const cfsPeriod = 100000

// V1 is a cgroup v1 layout: one hierarchy per controller under root.
type V1 struct {
	root string
	// ctrls are the controllers mounted here, deduplicated by the
	// directory they resolve to (cpu and cpuacct may be one).
	ctrls map[string]string // name -> hierarchy directory
}

// NewV1 is the v1 layout under root (Root on a real host).
func NewV1(root string) *V1 {
	v := &V1{root: root, ctrls: map[string]string{}}
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		dir := filepath.Join(root, c)
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(real, "cgroup.procs")); err != nil {
			continue
		}
		if seen[real] {
			// Co-mounted (cpu,cpuacct): the first name owns it.
			for name, d := range v.ctrls {
				if d == real {
					v.ctrls[c] = v.ctrls[name]
				}
			}
			continue
		}
		seen[real] = true
		v.ctrls[c] = real
	}
	return v
}

// Version implements Hierarchy.
func (v *V1) Version() int { return 1 }

// Open implements Hierarchy.
func (v *V1) Open(name string) Group {
	g := &v1Group{name: name, dirs: map[string]string{}}
	for c, h := range v.ctrls {
		g.dirs[c] = filepath.Join(h, ParentV1, name)
	}
	return g
}

// Create implements Hierarchy: the group in every mounted controller,
// then its limits. A controller absent here is skipped, except memory.
func (v *V1) Create(name string, l Limits) (Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if _, ok := v.ctrls["memory"]; !ok {
		return nil, fmt.Errorf("create cgroup %s: %w", name, ErrNoCgroups)
	}
	g := v.Open(name).(*v1Group)
	for _, d := range g.uniqueDirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", name, err)
		}
	}
	if err := g.setLimits(l); err != nil {
		_ = g.Remove(context.Background())
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	return g, nil
}

// v1Group is one VM's group across the v1 controllers.
type v1Group struct {
	name string
	dirs map[string]string // controller -> group directory
}

func (g *v1Group) Name() string { return g.name }
func (g *v1Group) Version() int { return 1 }

// uniqueDirs lists each directory once, in a stable order.
func (g *v1Group) uniqueDirs() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		d, ok := g.dirs[c]
		if ok && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

func (g *v1Group) Dirs() []string { return g.uniqueDirs() }

func (g *v1Group) ProcsFiles() []string {
	var out []string
	for _, d := range g.uniqueDirs() {
		out = append(out, filepath.Join(d, "cgroup.procs"))
	}
	return out
}

func (g *v1Group) Add(pid int) error {
	for _, f := range g.ProcsFiles() {
		if err := writeFile(f, strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("add %d to cgroup %s: %w", pid, g.name, err)
		}
	}
	return nil
}

// file is a controller's interface file in the group, "" when the
// controller is not mounted.
func (g *v1Group) file(ctrl, name string) string {
	d, ok := g.dirs[ctrl]
	if !ok {
		return ""
	}
	return filepath.Join(d, name)
}

// exists reports whether a controller's file is there.
func (g *v1Group) exists(ctrl, name string) bool {
	f := g.file(ctrl, name)
	if f == "" {
		return false
	}
	_, err := os.Stat(f)
	return err == nil
}

func (g *v1Group) setLimits(l Limits) error {
	if l.MemoryMax > 0 {
		mem := strconv.FormatInt(l.MemoryMax, 10)
		// memsw (memory+swap) must stay >= the memory limit: raise the
		// memory limit first when growing, memsw first when shrinking;
		// writing memsw twice covers both.
		swap := g.exists("memory", "memory.memsw.limit_in_bytes")
		if swap {
			_ = writeFile(g.file("memory", "memory.memsw.limit_in_bytes"), mem)
		}
		if err := writeFile(g.file("memory", "memory.limit_in_bytes"), mem); err != nil {
			return err
		}
		if swap {
			if err := writeFile(g.file("memory", "memory.memsw.limit_in_bytes"), mem); err != nil {
				return err
			}
		}
	}
	if l.CPUQuota > 0 && g.exists("cpu", "cpu.cfs_quota_us") {
		if err := writeFile(g.file("cpu", "cpu.cfs_period_us"), strconv.Itoa(cfsPeriod)); err != nil {
			return err
		}
		if err := writeFile(g.file("cpu", "cpu.cfs_quota_us"), strconv.FormatInt(quotaMicros(l.CPUQuota), 10)); err != nil {
			return err
		}
	}
	if l.PidsMax > 0 && g.exists("pids", "pids.max") {
		if err := writeFile(g.file("pids", "pids.max"), strconv.FormatInt(l.PidsMax, 10)); err != nil {
			return err
		}
	}
	if l.IOWeight > 0 && g.exists("blkio", "blkio.weight") {
		if err := writeFile(g.file("blkio", "blkio.weight"), strconv.Itoa(v1Weight(l.IOWeight))); err != nil {
			return err
		}
	}
	return nil
}

// quotaMicros is the CFS quota, per cfsPeriod, for cores.
func quotaMicros(cores float64) int64 {
	return int64(math.Round(cores * cfsPeriod))
}

// v1Weight maps a v2 io.weight (1-10000, default 100) onto blkio.weight
// (10-1000, default 500) as systemd does.
func v1Weight(w int) int {
	v := w * 5
	if w > 100 {
		v = 500 + (w-100)*500/9900
	}
	return max(10, min(1000, v))
}

func (g *v1Group) Limits() (Limits, error) {
	var l Limits
	var err error
	if l.MemoryMax, err = readInt(g.file("memory", "memory.limit_in_bytes")); err != nil {
		return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
	}
	if l.MemoryMax >= math.MaxInt64/2 { // the kernel's "no limit"
		l.MemoryMax = 0
	}
	if g.exists("cpu", "cpu.cfs_quota_us") {
		q, err1 := readInt(g.file("cpu", "cpu.cfs_quota_us"))
		p, err2 := readInt(g.file("cpu", "cpu.cfs_period_us"))
		if err := errors.Join(err1, err2); err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
		if q > 0 && p > 0 {
			l.CPUQuota = float64(q) / float64(p)
		}
	}
	if g.exists("pids", "pids.max") {
		if l.PidsMax, err = readInt(g.file("pids", "pids.max")); err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
	}
	if g.exists("blkio", "blkio.weight") {
		w, err := readInt(g.file("blkio", "blkio.weight"))
		if err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
		l.IOWeight = int(w) // in v1 units
	}
	return l, nil
}

func (g *v1Group) Stats() (Stats, error) {
	var s Stats
	var err error
	if s.MemoryCurrent, err = readInt(g.file("memory", "memory.usage_in_bytes")); err != nil {
		return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
	}
	if s.MemoryMax, err = readInt(g.file("memory", "memory.limit_in_bytes")); err != nil {
		return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
	}
	if s.MemoryMax >= math.MaxInt64/2 {
		s.MemoryMax = 0
	}
	if g.exists("cpuacct", "cpuacct.usage") {
		ns, err := readInt(g.file("cpuacct", "cpuacct.usage"))
		if err != nil {
			return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
		}
		s.CPUSeconds = float64(ns) / 1e9
	}
	if g.exists("pids", "pids.current") {
		if s.PidsCurrent, err = readInt(g.file("pids", "pids.current")); err != nil {
			return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
		}
	}
	return s, nil
}

func (g *v1Group) Pids() ([]int, error) {
	pids, err := readPids(g.file("memory", "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", g.name, err)
	}
	return pids, nil
}

func (g *v1Group) Remove(ctx context.Context) error {
	return rmdirs(ctx, g.uniqueDirs())
}
