package cgroup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// v2Controllers are the controllers a VM's group uses on v2.
var v2Controllers = []string{"memory", "cpu", "pids", "io"}

// V2 is the unified cgroup v2 hierarchy mounted at root.
type V2 struct {
	root string
	// mkdir makes a group directory; the kernel fills it with the
	// interface files (tests replace it to fake them).
	mkdir func(dir string) error
}

// NewV2 is the v2 hierarchy at root (Root on a v2 host).
func NewV2(root string) *V2 {
	return &V2{root: root, mkdir: func(dir string) error { return os.Mkdir(dir, 0o755) }}
}

// Version implements Hierarchy.
func (v *V2) Version() int { return 2 }

// Open implements Hierarchy.
func (v *V2) Open(name string) Group {
	return &v2Group{name: name, dir: filepath.Join(v.root, ParentV2, name)}
}

// Create implements Hierarchy: den's slice with the controllers the host
// offers enabled for its children, the group, its limits. Limits of a
// controller the host does not offer are skipped.
func (v *V2) Create(name string, l Limits) (Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	parent := filepath.Join(v.root, ParentV2)
	if err := v.mkdir(parent); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	// Delegate down: the root's subtree_control, then the slice's.
	for _, dir := range []string{v.root, parent} {
		if err := enable(dir); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", name, err)
		}
	}
	g := v.Open(name).(*v2Group)
	if err := v.mkdir(g.dir); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	if err := g.setLimits(l); err != nil {
		_ = g.Remove(context.Background())
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	return g, nil
}

// enable turns on, for dir's children, those of v2Controllers that dir
// has (its cgroup.controllers) and not yet enabled.
func enable(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	have := strings.Fields(string(data))
	on, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	enabled := strings.Fields(string(on))
	var want []string
	for _, c := range v2Controllers {
		if slices.Contains(have, c) && !slices.Contains(enabled, c) {
			want = append(want, "+"+c)
		}
	}
	if len(want) == 0 {
		return nil
	}
	return writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(want, " "))
}

// v2Group is one VM's group in the unified hierarchy.
type v2Group struct {
	name string
	dir  string
}

func (g *v2Group) Name() string         { return g.name }
func (g *v2Group) Version() int         { return 2 }
func (g *v2Group) Dirs() []string       { return []string{g.dir} }
func (g *v2Group) ProcsFiles() []string { return []string{g.file("cgroup.procs")} }
func (g *v2Group) file(name string) string {
	return filepath.Join(g.dir, name)
}

func (g *v2Group) has(name string) bool {
	_, err := os.Stat(g.file(name))
	return err == nil
}

func (g *v2Group) Add(pid int) error {
	if err := writeFile(g.file("cgroup.procs"), strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("add %d to cgroup %s: %w", pid, g.name, err)
	}
	return nil
}

func (g *v2Group) setLimits(l Limits) error {
	type limit struct {
		file, value string
	}
	var ls []limit
	if l.MemoryMax > 0 {
		ls = append(ls, limit{"memory.max", strconv.FormatInt(l.MemoryMax, 10)})
		// Like v1's memsw: the limit holds for memory and swap together.
		ls = append(ls, limit{"memory.swap.max", "0"})
	}
	if l.CPUQuota > 0 {
		ls = append(ls, limit{"cpu.max", fmt.Sprintf("%d %d", quotaMicros(l.CPUQuota), cfsPeriod)})
	}
	if l.PidsMax > 0 {
		ls = append(ls, limit{"pids.max", strconv.FormatInt(l.PidsMax, 10)})
	}
	if l.IOWeight > 0 {
		ls = append(ls, limit{"io.weight", "default " + strconv.Itoa(max(1, min(10000, l.IOWeight)))})
	}
	for _, x := range ls {
		if !g.has(x.file) {
			continue // the controller is not offered here
		}
		if err := writeFile(g.file(x.file), x.value); err != nil {
			return err
		}
	}
	return nil
}

func (g *v2Group) Limits() (Limits, error) {
	var l Limits
	var err error
	if g.has("memory.max") {
		if l.MemoryMax, err = readInt(g.file("memory.max")); err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
	}
	if g.has("cpu.max") {
		data, err := os.ReadFile(g.file("cpu.max"))
		if err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
		f := strings.Fields(string(data))
		if len(f) == 2 && f[0] != "max" {
			q, err1 := strconv.ParseInt(f[0], 10, 64)
			p, err2 := strconv.ParseInt(f[1], 10, 64)
			if err := errors.Join(err1, err2); err != nil || p == 0 {
				return l, fmt.Errorf("cgroup %s limits: cpu.max %q", g.name, data)
			}
			l.CPUQuota = float64(q) / float64(p)
		}
	}
	if g.has("pids.max") {
		if l.PidsMax, err = readInt(g.file("pids.max")); err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
	}
	if g.has("io.weight") {
		data, err := os.ReadFile(g.file("io.weight"))
		if err != nil {
			return l, fmt.Errorf("cgroup %s limits: %w", g.name, err)
		}
		// "default 100\n8:0 200\n"
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == "default" {
				l.IOWeight, _ = strconv.Atoi(f[1])
			}
		}
	}
	return l, nil
}

func (g *v2Group) Stats() (Stats, error) {
	var s Stats
	var err error
	if g.has("memory.current") {
		if s.MemoryCurrent, err = readInt(g.file("memory.current")); err != nil {
			return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
		}
		if s.MemoryMax, err = readInt(g.file("memory.max")); err != nil {
			return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
		}
	}
	if data, err := os.ReadFile(g.file("cpu.stat")); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == "usage_usec" {
				us, _ := strconv.ParseInt(f[1], 10, 64)
				s.CPUSeconds = float64(us) / 1e6
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
	}
	if g.has("pids.current") {
		if s.PidsCurrent, err = readInt(g.file("pids.current")); err != nil {
			return s, fmt.Errorf("cgroup %s stats: %w", g.name, err)
		}
	}
	if s.MemoryMax >= math.MaxInt64/2 {
		s.MemoryMax = 0
	}
	return s, nil
}

func (g *v2Group) Pids() ([]int, error) {
	pids, err := readPids(g.file("cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", g.name, err)
	}
	return pids, nil
}

// Remove implements Group. A fake (a plain directory with files in it)
// is removed with its files.
func (g *v2Group) Remove(ctx context.Context) error {
	if st, err := os.Stat(g.dir); err == nil && st.IsDir() && !isCgroupFS(g.dir) {
		return os.RemoveAll(g.dir)
	}
	return rmdirs(ctx, []string{g.dir})
}
