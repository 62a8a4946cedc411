package e2e

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/denhq/den/api"
)

// TestDiff: files changed through den exec between two checkpoints show
// in den diff exactly (created, modified, chmod'ed, deleted, renamed,
// symlinked, hard-linked, a large file appended to, a directory replaced
// by a file), as text and as JSON; against the current state a disk-only
// checkpoint is taken and named; bad specs, unknown VMs and checkpoints
// are one-line errors; another user is refused. Then den restore --path
// puts /root/p back as at the first checkpoint in the running VM, and
// leaves a file outside it and a running process alone.
func TestDiff(t *testing.T) {
	d := startDaemon(t)
	d.reachableBy()
	alice, bob := localUser(t, "den-alice"), localUser(t, "den-bob")
	d.mustAs(alice, "create", "dbox", "--memory", "256M", "--idle-timeout", "0")
	sh := func(script string) {
		t.Helper()
		d.mustAs(alice, "exec", "dbox", "--", "sh", "-c", script)
	}
	sh(`mkdir -p /root/p/dir && cd /root/p && echo one > mod.txt && echo keep > keep.txt && echo bye > gone.txt &&
		echo mv > old && echo '#!/bin/sh' > s.sh && echo a > dir/a && dd if=/dev/zero of=big bs=1024 count=2048 2>/dev/null && sync`)
	d.mustAs(alice, "checkpoint", "dbox", "-m", "before")
	// No sync: the checkpoint has the guest write out its page cache.
	sh(`cd /root/p && echo two >> mod.txt && rm gone.txt && mv old new && chmod 755 s.sh && ln -s mod.txt link &&
		ln keep.txt hard && echo more >> big && rm -r dir && echo file > dir && echo hi > new.txt`)
	d.mustAs(alice, "checkpoint", "dbox", "-m", "after")

	want := []string{
		"changed /root/p/big content",
		"changed /root/p/dir type",
		"removed /root/p/dir/a",
		"removed /root/p/gone.txt",
		"added /root/p/hard link-of /root/p/keep.txt",
		"added /root/p/link",
		"changed /root/p/mod.txt content",
		"added /root/p/new moved-from /root/p/old",
		"added /root/p/new.txt",
		"removed /root/p/old",
		"changed /root/p/s.sh mode",
	}
	wantSum := api.DiffSummary{Added: 4, Removed: 3, Changed: 4, AddedBytes: 5 + 3 + 3, RemovedBytes: 2 + 4 + 3, ChangedBytes: 5 + 5 + 4}
	check := func(out string) *api.Diff {
		t.Helper()
		var df api.Diff
		if err := json.Unmarshal([]byte(out), &df); err != nil {
			t.Fatalf("diff --json: %v\n%s", err, out)
		}
		var got []string
		for _, c := range df.Changes {
			s := c.Op + " " + c.Path
			if len(c.What) > 0 {
				s += " " + strings.Join(c.What, ",")
			}
			if c.LinkOf != "" {
				s += " link-of " + c.LinkOf
			}
			if c.MovedFrom != "" {
				s += " moved-from " + c.MovedFrom
			}
			got = append(got, s)
		}
		if !reflect.DeepEqual(got, want) || df.Summary != wantSum {
			t.Fatalf("diff:\n%s\n%+v\nwant:\n%s\n%+v", strings.Join(got, "\n"), df.Summary, strings.Join(want, "\n"), wantSum)
		}
		return &df
	}
	df := check(d.mustAs(alice, "diff", "dbox@cp-1", "dbox@cp-2", "--path", "/root/p", "--json"))
	for _, c := range df.Changes {
		switch c.Path {
		case "/root/p/s.sh":
			if c.Old.Mode != "0644" || c.New.Mode != "0755" {
				t.Errorf("chmod: %s -> %s", c.Old.Mode, c.New.Mode)
			}
		case "/root/p/link":
			if c.New.Type != "symlink" || c.New.Target != "mod.txt" {
				t.Errorf("symlink: %+v", c.New)
			}
		case "/root/p/big":
			if c.Old.Size != 2<<20 || c.New.Size != 2<<20+5 {
				t.Errorf("appended: %d -> %d", c.Old.Size, c.New.Size)
			}
		}
	}

	text := d.mustAs(alice, "diff", "dbox@cp-1", "dbox@cp-2", "--path", "/root/p", "-p")
	for _, s := range []string{
		"/root/p/link -> mod.txt", "/root/p/s.sh (mode 0644 -> 0755)", "/root/p/dir (type dir -> file)",
		"/root/p/hard (hard link of /root/p/keep.txt)", "/root/p/new (from /root/p/old)",
		"--- a/root/p/mod.txt\n+++ b/root/p/mod.txt\n@@ -1 +1,2 @@\n one\n+two\n", "Binary files a/root/p/big and b/root/p/big differ",
		"4 added (11 bytes), 4 changed (+14 bytes), 3 removed (9 bytes)\n",
	} {
		if !strings.Contains(text, s) {
			t.Errorf("den diff -p: no %q in\n%s", s, text)
		}
	}
	if stat := d.mustAs(alice, "diff", "dbox@cp-1", "dbox@cp-2", "--path", "/root/p", "--stat"); !strings.Contains(stat, "/root/p/new.txt") || strings.Contains(stat, "0644") {
		t.Errorf("den diff --stat:\n%s", stat)
	}
	// The whole disk: ours are there (the guest may change more).
	if all := d.mustAs(alice, "diff", "dbox@cp-1", "dbox@cp-2"); !strings.Contains(all, "/root/p/new.txt") {
		t.Errorf("den diff of the whole disk:\n%s", all)
	}

	// Against the current state: a disk-only checkpoint, said so.
	now := d.mustAs(alice, "diff", "dbox@cp-1", "--path", "/root/p")
	if !strings.Contains(now, "comparing dbox@cp-1 with dbox@cp-3, a disk-only checkpoint of dbox's current state taken now") ||
		!strings.Contains(now, "4 added (11 bytes)") {
		t.Errorf("den diff against the current state:\n%s", now)
	}
	if out := d.mustAs(alice, "checkpoints", "dbox"); !strings.Contains(out, "cp-3") || !strings.Contains(out, "disk-only") {
		t.Errorf("checkpoints after a diff with the current state:\n%s", out)
	}
	if vm := d.info("dbox"); vm.State != "running" {
		t.Errorf("the vm after the diffs: %s", vm.State)
	}

	// Bad input: one line, non-zero exit; another user's VM is not found.
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"diff", "dbox"}, `"dbox" is not VM@CHECKPOINT`, 2},
		{[]string{"diff", "dbox@"}, `"dbox@" is not VM@CHECKPOINT`, 2},
		{[]string{"diff", "dbox@cp-1", "dbox@x/y"}, "bad checkpoint", 2},
		{[]string{"diff", "nobox@cp-1", "dbox@cp-2"}, `no vm named "nobox"`, 1},
		{[]string{"diff", "dbox@cp-9", "dbox@cp-2"}, `vm "dbox" has no checkpoint cp-9`, 1},
		{[]string{"diff", "dbox@cp-1", "dbox@cp-2", "--path", "/root/../etc"}, `".." is not allowed`, 2},
	} {
		_, err := d.runAs(alice, tc.args...)
		if code := exitCode(err); code != tc.code || !strings.Contains(stderrOf(err), tc.want) || strings.Contains(stderrOf(err), "\n") {
			t.Errorf("den %s: exit %d, %q; want exit %d, one line with %q", strings.Join(tc.args, " "), code, stderrOf(err), tc.code, tc.want)
		}
	}
	for _, args := range [][]string{{"diff", "dbox@cp-1", "dbox@cp-2"}, {"diff", "dbox@cp-1"}} {
		_, err := d.runAs(bob, args...)
		if exitCode(err) == 0 || !strings.Contains(stderrOf(err), `no vm named "dbox"`) {
			t.Errorf("bob: den %s: %v; want no vm named", strings.Join(args, " "), err)
		}
	}
	if out := d.mustAs(alice, "checkpoints", "dbox", "--json"); strings.Contains(out, `"cp-4"`) {
		t.Errorf("bob's refused diff took a checkpoint: %s", out)
	}

	// den restore --path: /root/p as at cp-1, in the running VM; a file
	// outside it and a process stay.
	sh(`echo stays > /root/outside.txt; sleep 100000 >/dev/null 2>&1 & echo $! > /root/sleeper.pid`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"restore", "dbox", "cp-1", "--path", "/"}, "whole disk"},
		{[]string{"restore", "dbox", "cp-1", "--path", "/root/../etc"}, `".." is not allowed`},
		{[]string{"restore", "dbox", "cp-9", "--path", "/root/p"}, `vm "dbox" has no checkpoint cp-9`},
		{[]string{"restore", "dbox", "cp-1", "--path", "/root/p", "--no-save"}, "--path takes neither"},
	} {
		_, err := d.runAs(alice, tc.args...)
		if exitCode(err) == 0 || !strings.Contains(stderrOf(err), tc.want) || strings.Contains(stderrOf(err), "\n") {
			t.Errorf("den %s: %q; want one line with %q", strings.Join(tc.args, " "), stderrOf(err), tc.want)
		}
	}
	if _, err := d.runAs(bob, "restore", "dbox", "cp-1", "--path", "/root/p"); exitCode(err) == 0 || !strings.Contains(stderrOf(err), `no vm named "dbox"`) {
		t.Errorf("bob: den restore --path: %v", err)
	}
	var put api.PathsRestored
	out := d.mustAs(alice, "restore", "dbox", "cp-1", "--path", "/root/p", "--json")
	if err := json.Unmarshal([]byte(out), &put); err != nil {
		t.Fatalf("restore --path --json: %v\n%s", err, out)
	}
	var did []string
	for _, a := range put.Actions {
		did = append(did, a.Did+" "+a.Path)
	}
	wantDid := []string{
		"removed /root/p/new.txt", "removed /root/p/new", "removed /root/p/link", "removed /root/p/hard",
		"rewritten /root/p/big", "restored /root/p/dir", "restored /root/p/dir/a", "restored /root/p/gone.txt",
		"rewritten /root/p/mod.txt", "restored /root/p/old", "chmod /root/p/s.sh",
	}
	if !reflect.DeepEqual(did, wantDid) || put.Saved == "" {
		t.Errorf("restore --path did (saved %q):\n%s\nwant:\n%s", put.Saved, strings.Join(did, "\n"), strings.Join(wantDid, "\n"))
	}
	var left api.Diff
	if out := d.mustAs(alice, "diff", "dbox@cp-1", "--path", "/root/p", "--json"); json.Unmarshal([]byte(out), &left) != nil || len(left.Changes) != 0 {
		t.Errorf("a diff with cp-1 after restore --path:\n%s", out)
	}
	if back := d.mustAs(alice, "diff", "dbox@cp-1", "dbox@"+put.Saved, "--path", "/root/p", "--stat"); !strings.Contains(back, "/root/p/new.txt") {
		t.Errorf("the saved checkpoint %s does not hold the state before restore --path:\n%s", put.Saved, back)
	}
	if got := d.mustAs(alice, "exec", "dbox", "--", "sh", "-c", `cat /root/outside.txt /root/p/mod.txt && stat -c %a /root/p/s.sh && kill -0 $(cat /root/sleeper.pid) && echo alive`); got != "stays\none\n644\nalive\n" {
		t.Errorf("after restore --path: %q", got)
	}
	if vm := d.info("dbox"); vm.State != "running" {
		t.Errorf("the vm after restore --path: %s", vm.State)
	}
}
