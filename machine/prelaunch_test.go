package machine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/denhq/den/cgroup"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
)

// prelaunchStub is a prelaunched VMM that records whether it was
// discarded and where it was moved.
type prelaunchStub struct {
	vmm.Prelauncher
	discarded bool
	movedTo   vmm.RunDir
}

func (s *prelaunchStub) Discard(context.Context) error { s.discarded = true; return nil }
func (s *prelaunchStub) MoveRunDir(rd vmm.RunDir) error {
	s.movedTo = rd
	return nil
}

// TestPrelaunchedAfterVolumeLoss: a VMM prelaunched for a restore opened
// its disk on the mount of that moment. When the mount is lost after
// that, the restore does not take it (it would run on a dead disk that
// no volume-loss check sees: it was no VM's instance when the loss came);
// otherwise it is taken with the time it opened its disk, which the
// volume-loss check of its instance goes by.
func TestPrelaunchedAfterVolumeLoss(t *testing.T) {
	for _, lost := range []bool{true, false} {
		dir := t.TempDir()
		m := wire(&Manager{state: StateDir(dir), conf: &confinement{groups: map[string]cgroup.Group{}}})
		local := filepath.Join(dir, "local-copy")
		if err := os.WriteFile(local, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		opened := time.Now().Add(-time.Minute)
		if lost {
			m.volumeLostAt = opened.Add(time.Second)
		} else {
			m.volumeLostAt = opened.Add(-time.Second)
		}
		done := make(chan struct{})
		close(done)
		stub := &prelaunchStub{}
		ram := &stagedRAM{dir: filepath.Join(dir, "staged"), local: local, wait: func() error { return nil }}
		p := &prelaunched{m: m, name: "_pre-a-1", rd: m.state.Run("_pre-a-1"), ram: ram,
			disk: &stagedDisk{used: true}, done: done, hv: stub, opened: opened}
		ram.pre = p
		hv, at := ram.prelaunched().take(context.Background(), registry.VM{Name: "a"}, nil)
		switch {
		case lost && (hv != nil || !stub.discarded):
			t.Fatalf("a vmm prelaunched before the loss: taken %v, discarded %v", hv != nil, stub.discarded)
		case !lost && (hv == nil || stub.discarded || stub.movedTo != m.state.Run("a")):
			t.Fatalf("a vmm prelaunched after the loss: taken %v, discarded %v, moved to %q", hv != nil, stub.discarded, stub.movedTo)
		case !lost && !at.Equal(opened):
			t.Fatalf("taken with start %v, want when it opened its disk (%v)", at, opened)
		}
	}
}
