package cgroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
)

func needRoot(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t, "cgroups are made by root")
}

// startSleeper starts a process that lives until the test ends.
func startSleeper(t *testing.T, attr *syscall.SysProcAttr) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// procCgroup is the line of /proc/PID/cgroup for a hierarchy ("memory",
// or "" for the unified one).
func procCgroup(t *testing.T, pid int, ctrl string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), ctrl) || len(f) == 3 && ctrl == "" && f[1] == "" {
			return f[2]
		}
	}
	return ""
}

func TestV1Real(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat(filepath.Join(Root, "memory", "memory.limit_in_bytes")); err != nil {
		t.Skip("no cgroup v1 memory controller on this host")
	}
	h := NewV1(Root)
	name := fmt.Sprintf("test-%d", os.Getpid())
	want := Limits{MemoryMax: 256 << 20, CPUQuota: 1.5, PidsMax: 64, IOWeight: 100}
	g, err := h.Create(name, want)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove(context.Background()) })
	got, err := g.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if got.MemoryMax != want.MemoryMax || got.CPUQuota != want.CPUQuota || got.PidsMax != want.PidsMax {
		t.Fatalf("limits read back %+v, want %+v", got, want)
	}
	cmd := startSleeper(t, nil)
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"memory", "cpu", "pids"} {
		if p := procCgroup(t, cmd.Process.Pid, c); p != "/den/"+name {
			t.Errorf("%s cgroup of the child is %q, want /den/%s", c, p, name)
		}
	}
	pids, err := g.Pids()
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("pids %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// (v1 does not move the memory a process charged before it joined:
	// memory.usage_in_bytes may be 0 here.)
	if st.PidsCurrent != 1 || st.MemoryMax != want.MemoryMax || st.MemoryCurrent < 0 {
		t.Fatalf("stats %+v", st)
	}
	// A group with a process in it is not removed before ctx ends...
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.Remove(ctx); err == nil {
		t.Fatal("removed a group with a live process")
	}
	// ...and is once the process is gone.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := g.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", d, err)
		}
	}
}

// TestV2CloneInto puts a child into a v2 group as it is cloned, on the
// unified hierarchy of a hybrid host (or the v2 root of a v2 host).
func TestV2CloneInto(t *testing.T) {
	needRoot(t)
	root := filepath.Join(Root, "unified")
	if _, err := os.Stat(filepath.Join(Root, "cgroup.controllers")); err == nil {
		root = Root
	}
	if !isCgroupFS(root) {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	h := NewV2(root)
	name := fmt.Sprintf("test-%d", os.Getpid())
	g, err := h.Create(name, Limits{PidsMax: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove(context.Background()) })
	fd, err := syscall.Open(g.Dirs()[0], syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	cmd := startSleeper(t, &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd})
	if p := procCgroup(t, cmd.Process.Pid, ""); p != "/"+ParentV2+"/"+name {
		t.Fatalf("unified cgroup of the child is %q, want /%s/%s", p, ParentV2, name)
	}
	pids, err := g.Pids()
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("pids %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := g.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// fakeV2 is a v2 hierarchy in a temporary directory: mkdir makes the
// interface files the kernel would.
func fakeV2(t *testing.T) (*V2, string) {
	root := t.TempDir()
	files := map[string]string{
		"cgroup.controllers": "cpuset cpu io memory hugetlb pids\n", "cgroup.subtree_control": "",
		"cgroup.procs": "", "memory.max": "max\n", "memory.swap.max": "max\n", "memory.current": "12345\n",
		"cpu.max": "max 100000\n", "cpu.stat": "usage_usec 2500000\nuser_usec 1\n", "pids.max": "max\n",
		"pids.current": "3\n", "io.weight": "default 100\n",
	}
	mk := func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	for f, v := range files {
		if err := os.WriteFile(filepath.Join(root, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v := NewV2(root)
	v.mkdir = mk
	return v, root
}

func TestV2LimitFiles(t *testing.T) {
	h, root := fakeV2(t)
	want := Limits{MemoryMax: 600 << 20, CPUQuota: 2, PidsMax: 256, IOWeight: 200}
	g, err := h.Create("vm1", want)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ParentV2, "vm1")
	if g.Dirs()[0] != dir {
		t.Fatalf("group dir %s, want %s", g.Dirs()[0], dir)
	}
	for f, v := range map[string]string{
		"memory.max": "629145600", "memory.swap.max": "0", "cpu.max": "200000 100000",
		"pids.max": "256", "io.weight": "default 200",
	} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || string(data) != v {
			t.Errorf("%s = %q (%v), want %q", f, data, err, v)
		}
	}
	for _, d := range []string{root, filepath.Join(root, ParentV2)} {
		data, _ := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
		if string(data) != "+memory +cpu +pids +io" {
			t.Errorf("%s subtree_control %q", d, data)
		}
	}
	got, err := g.Limits()
	if err != nil || got != want {
		t.Fatalf("limits read back %+v (%v), want %+v", got, err, want)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryCurrent != 12345 || st.MemoryMax != want.MemoryMax || st.CPUSeconds != 2.5 || st.PidsCurrent != 3 {
		t.Fatalf("stats %+v", st)
	}
	if err := g.Add(4242); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); string(data) != "4242" {
		t.Fatalf("cgroup.procs %q", data)
	}
	if err := g.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("group still there: %v", err)
	}
}

func TestNames(t *testing.T) {
	h, _ := fakeV2(t)
	for _, n := range []string{"", ".", "..", "a/b"} {
		if _, err := h.Create(n, Limits{}); err == nil {
			t.Errorf("created a group named %q", n)
		}
	}
}

func TestV1Weight(t *testing.T) {
	for in, want := range map[int]int{1: 10, 100: 500, 10000: 1000, 50: 250} {
		if got := v1Weight(in); got != want {
			t.Errorf("v1Weight(%d) = %d, want %d", in, got, want)
		}
	}
}
