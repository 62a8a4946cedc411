package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalMemoryCopiesAndSpareDisks: a sleep and a memory checkpoint
// leave a local copy of the guest's memory in STATE/memory/VM, which the
// wake and the restore read (their traces say so) and which goes with the
// slot, the checkpoint and the VM; a second create from the same base
// takes a spare clone of its disk instead of cloning it.
func TestLocalMemoryCopiesAndSpareDisks(t *testing.T) {
	d := startDaemon(t)
	steps := d.steps
	copies := func(vm, prefix string) []string {
		m, _ := filepath.Glob(filepath.Join(d.state, "memory", vm, prefix+"*"))
		return m
	}
	d.must("create", "box", "--memory", "128M", "--idle-timeout", "0")
	d.must("exec", "box", "--", "sh", "-c", "echo one > /root/mark")

	d.must("sleep", "box")
	if cs := copies("box", "suspend-"); len(cs) != 1 {
		t.Fatalf("after a sleep, local copies %v, want one suspend-*", cs)
	}
	d.must("wake", "box")
	if s := steps("box"); !strings.Contains(s, "qemu: copy memory (local copy)") {
		t.Fatalf("the wake did not read the local copy: %s", s)
	}
	if out := d.must("exec", "box", "--", "cat", "/root/mark"); out != "one\n" {
		t.Fatalf("after the wake: %q", out)
	}
	d.must("sleep", "box") // a second sleep replaces the first copy
	if cs := copies("box", "suspend-"); len(cs) != 1 {
		t.Fatalf("after a second sleep, local copies %v, want one suspend-*", cs)
	}
	d.must("wake", "box")

	if id := strings.TrimSpace(d.must("checkpoint", "box")); id != "cp-1" {
		t.Fatalf("checkpoint id %q", id)
	}
	if cs := copies("box", "cp-1-"); len(cs) != 1 {
		t.Fatalf("after a checkpoint, local copies %v, want one cp-1-*", cs)
	}
	d.must("exec", "box", "--", "sh", "-c", "echo two > /root/mark")
	d.must("restore", "box", "cp-1", "--no-save")
	// Read while the restore verifies and stops the VM, into a RAM file
	// the new QEMU maps (when the host has room for the memory twice).
	if s := steps("box"); !strings.Contains(s, "qemu: copy memory (local copy)") &&
		!(strings.Contains(s, "stage the memory from its local copy") && strings.Contains(s, "qemu: wait for the staged memory") && !strings.Contains(s, "staging failed")) {
		t.Fatalf("the restore did not read the local copy: %s", s)
	}
	if out := d.must("exec", "box", "--", "cat", "/root/mark"); out != "one\n" {
		t.Fatalf("after the restore: %q", out)
	}
	if cs := copies("box", "suspend-"); len(cs) != 0 {
		t.Fatalf("the restore dropped the suspend slot but not its copy: %v", cs)
	}
	d.must("checkpoint", "rm", "box", "cp-1")
	if cs := copies("box", "cp-1-"); len(cs) != 0 {
		t.Fatalf("a deleted checkpoint's copy stays: %v", cs)
	}

	// The first create (box) left a spare clone of the base's disk.
	d.must("create", "two", "--memory", "128M", "--idle-timeout", "0")
	if s := steps("two"); !strings.Contains(s, "take a spare disk") || strings.Contains(s, "clone disk") {
		t.Fatalf("the second create did not take a spare disk: %s", s)
	}
	if out := d.must("exec", "two", "--", "cat", "/etc/hostname"); out != "two\n" {
		t.Fatalf("hostname of the second vm: %q", out)
	}
	d.must("rm", "--force", "box")
	if _, err := os.Stat(filepath.Join(d.state, "memory", "box")); !os.IsNotExist(err) {
		t.Fatalf("a removed vm's copies stay: %v", err)
	}
}
