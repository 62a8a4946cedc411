package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/storage"
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

// TestSnapshotsWrittenOverTheLast: a sleep or a memory checkpoint of a VM
// whose RAM came from a snapshot with a local copy clones that snapshot's
// memory and writes only the pages that changed (their traces say so);
// what it wrote is whole against its digests and restores the guest's
// memory as it was, read from the volume after a daemon restart dropped
// the local copies.
func TestSnapshotsWrittenOverTheLast(t *testing.T) {
	// The layout before memory was stored by content, which den bench
	// still compares with.
	d := startDaemonIn(t, func(string) []string { return []string{"--memory-files"} })
	writtenOver := func(what string) {
		t.Helper()
		s := d.steps("box")
		if !strings.Contains(s, "volume: clone the last snapshot's memory") || !strings.Contains(s, "qemu: write the changed memory") ||
			strings.Contains(s, "qemu: copy the memory") {
			t.Fatalf("%s wrote its memory whole: %s", what, s)
		}
	}
	d.must("create", "box", "--memory", "128M", "--idle-timeout", "0")
	d.must("exec", "box", "--", "sh", "-c", "echo one > /tmp/mark") // /tmp is a tmpfs: memory only
	d.must("sleep", "box")
	d.must("wake", "box") // from the slot's local copy: the RAM equals it
	d.must("exec", "box", "--", "sh", "-c", "echo two > /tmp/mark; head -c 4000000 /dev/urandom > /tmp/blob; md5sum /tmp/blob > /tmp/sum")
	d.must("sleep", "box")
	writtenOver("the sleep after a wake")
	d.must("wake", "box")
	if id := strings.TrimSpace(d.must("checkpoint", "box")); id != "cp-1" {
		t.Fatalf("checkpoint id %q", id)
	}
	writtenOver("the checkpoint after a wake")
	d.must("exec", "box", "--", "sh", "-c", "echo three > /tmp/mark")
	d.must("sleep", "box") // over the checkpoint's memory
	writtenOver("the sleep after a checkpoint")

	// The digests, made from the local copies of the RAM, are written
	// before the restart: what the wake and the restore then read from
	// the volume is checked against them.
	mnt := filepath.Join(d.state, "juicefs", "mnt")
	slot, cp := filepath.Join(mnt, string(storage.SuspendDir("box"))), filepath.Join(mnt, string(checkpoint.Dir("box", "cp-1")))
	if !eventually(3*time.Minute, func() bool { return checkpoint.Sealed(slot) && checkpoint.Sealed(cp) }) {
		t.Fatal("the slot's and the checkpoint's digests were not written within 3 minutes")
	}
	d.kill()
	d.start()
	var verified []api.Verification
	if err := json.Unmarshal([]byte(d.must("checkpoint", "verify", "box", "cp-1", "--json")), &verified); err != nil {
		t.Fatal(err)
	}
	if len(verified) != 1 {
		t.Fatalf("verify of cp-1 reported %d checkpoints: %+v", len(verified), verified)
	}
	for _, r := range verified {
		if r.Status != "ok" {
			t.Fatalf("verify of the checkpoint written over the slot: %+v", r)
		}
	}
	d.must("wake", "box")
	if s := d.steps("box"); strings.Contains(s, "local copy") {
		t.Fatalf("the wake after a restart read a local copy: %s", s)
	}
	check := "cat /tmp/mark; md5sum -c /tmp/sum >/dev/null && echo intact"
	if out := d.must("exec", "box", "--", "sh", "-c", check); out != "three\nintact\n" {
		t.Fatalf("after a wake from the memory written over the checkpoint's: %q", out)
	}
	d.must("restore", "box", "cp-1", "--no-save")
	if out := d.must("exec", "box", "--", "sh", "-c", check); out != "two\nintact\n" {
		t.Fatalf("after a restore of the checkpoint written over the slot: %q", out)
	}
}
