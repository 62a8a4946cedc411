package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidationCLI: every argument and flag of the CLI that
// names something, and every free string over its limit, is refused with
// a usage error (exit status 2) before den connects to the daemon (the
// socket is missing: a connection would be exit status 1), so nothing is
// sent, let alone written. The rules are the daemon's (internal/validate).
func TestValidationCLI(t *testing.T) {
	long := strings.Repeat("a", 300)
	nul := "a\x00b"
	keyFile := filepath.Join(t.TempDir(), "id.pub")
	if err := os.WriteFile(keyFile, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvb7JXYQ9ZEl7sFq8fBtd0t1S1CMlAhB6Xhjds5AY7x x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "../x"}, `den create: bad vm name "../x"`},
		{[]string{"create", nul}, `bad vm name "a\x00b"`},
		{[]string{"create", long}, `(300 bytes)`},
		{[]string{"create", "Box"}, `bad vm name "Box"`},
		{[]string{"create", "den"}, `vm name "den" is reserved`},
		{[]string{"create", "box", "--image", "../x"}, `bad image name "../x"`},
		{[]string{"create", "box", "--image", "minimal" + nul}, `bad image name`},
		{[]string{"create", "box", "--image", long}, `(300 bytes)`},
		{[]string{"info", "../x"}, `bad vm name "../x"`},
		{[]string{"rm", "box", "../x"}, `den rm: bad vm name "../x"`},
		{[]string{"exec", "../x", "--", "true"}, `bad vm name "../x"`},
		{[]string{"logs", "../x"}, `bad vm name`},
		{[]string{"ssh", "../x"}, `bad vm name`},
		{[]string{"sleep", "../x"}, `bad vm name`},
		{[]string{"wake", "../x"}, `bad vm name`},
		{[]string{"resize", "../x", "--disk", "8G"}, `bad vm name`},
		{[]string{"checkpoints", "../x"}, `bad vm name`},
		{[]string{"checkpoint", "../x"}, `bad vm name`},
		{[]string{"checkpoint", "box", "-m", strings.Repeat("c", 1_000_000)}, `checkpoint comment of 1000000 bytes is too long: at most 4096`},
		{[]string{"checkpoint", "box", "-m", nul}, `no NUL`},
		{[]string{"checkpoint", "rm", "box", "cp-1", "../x"}, `bad checkpoint id "../x"`},
		{[]string{"checkpoint", "rm", "../x", "cp-1"}, `bad vm name "../x"`},
		{[]string{"checkpoint", "verify", "box", "cp-0"}, `bad checkpoint id "cp-0"`},
		{[]string{"restore", "box", "../x"}, `bad checkpoint id "../x"`},
		{[]string{"restore", "box", "cp-1" + nul}, `bad checkpoint id`},
		{[]string{"restore", "../x", "cp-1"}, `bad vm name`},
		{[]string{"fork", "box@../x", "box2"}, `bad checkpoint id "../x"`},
		{[]string{"fork", "box@", "box2"}, `bad checkpoint id ""`},
		{[]string{"fork", "box", "../x"}, `bad vm name "../x"`},
		{[]string{"fork", "../x@cp-1", "box2"}, `bad vm name "../x"`},
		{[]string{"keys", "add", keyFile, "--user", "../x"}, `bad user name "../x"`},
		{[]string{"keys", "add", keyFile, "--user", long}, `(300 bytes)`},
		{[]string{"keys", "add", keyFile, "--name", long}, `key name of 300 bytes is too long`},
		{[]string{"keys", "add", keyFile, "--name", nul}, `no NUL`},
		{[]string{"keys", "rm", long}, `key fingerprint or name of 300 bytes is too long`},
	} {
		stderr, code := runDen(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || len(stderr) > 1000 {
			t.Errorf("den %.80q: exit %d, stderr %.300q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
	// Good values get as far as the (missing) daemon.
	for _, args := range [][]string{
		{"create", "box", "--image", "debian"},
		{"checkpoint", "box", "-m", strings.Repeat("é", 2048)},
		{"restore", "box", "cp-12"},
		{"fork", "box@cp-1", "box2"},
		{"fork", "box", "box2"},
	} {
		if stderr, code := runDen(t, args...); code != 1 || !strings.Contains(stderr, "daemon") {
			t.Errorf("den %.80q: exit %d, %.200q; want 1 and the daemon's absence", args, code, stderr)
		}
	}
}
