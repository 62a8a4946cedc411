package machine_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/denhq/den/internal/testutil"
)

// TestRAMFilesFreed: a stopped VMM's RAM file is freed (in the
// background), and a start removes the RAM directories no VMM uses: those
// moved aside to be freed, a warm base's throwaway VM's, a gone VM's.
func TestRAMFilesFreed(t *testing.T) {
	e := newEnv(t)
	ramDir := filepath.Join(t.TempDir(), "ram")
	e.cfg.RAMDir = ramDir
	e.restart()
	ctx := ctxT(t)
	e.create("r")
	e.create("s")
	entries := func() []string {
		var names []string
		ents, _ := os.ReadDir(ramDir)
		for _, ent := range ents {
			names = append(names, ent.Name())
		}
		return names
	}
	mkRAM := func(dir string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(ramDir, dir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ramDir, dir, "memory"), []byte("guest ram"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The fake VMM keeps its RAM in itself: stand in its files.
	mkRAM("r")
	mkRAM("s")
	if err := e.m.Sleep(ctx, "r", false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, testTimeout, "the sleeping vm's RAM file is freed", func() bool { return !slices.Contains(entries(), "r") && len(entries()) == 1 })

	// Left by a crash: a directory moved aside, a restore's staged
	// memory, a base's throwaway VM's, a VM whose VMM is gone. Not den's
	// (the directory may be a shared one): a file, names no VM of this
	// daemon's has.
	for _, d := range []string{".gone-r-1", ".staged-r-2", "_base-base-0123", "r", "Not_A_VM", "other", ".other"} {
		mkRAM(d)
	}
	if err := os.WriteFile(filepath.Join(ramDir, "notes"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if got, want := entries(), []string{".other", "Not_A_VM", "notes", "other", "s"}; !slices.Equal(got, want) {
		t.Fatalf("RAM dir after a start: %v, want %v (the running vm's and what is not den's)", got, want)
	}
	if err := e.m.Wake(ctx, "r"); err != nil {
		t.Fatal(err)
	}
}
