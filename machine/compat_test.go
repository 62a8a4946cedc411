//go:build linux

package machine_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// TestSnapshotOfAnotherVMMRefused: every memory snapshot records the
// host, VMM and CPU it was taken on; a VMM that cannot read it (another
// version here, as after an upgrade or on another host) is refused
// before anything changes, in one line saying why: a sleeping VM stays
// asleep, a restore leaves the VM as it was, and both work again under
// the VMM that took them.
func TestSnapshotOfAnotherVMMRefused(t *testing.T) {
	e := newEnvWith(t, func(c *machine.Config) { c.HostName = "host-a" })
	ctx := ctxT(t)
	e.drv.SetVersion("1.0")
	e.create("v")
	cp, err := e.m.Checkpoint(ctx, "v", machine.CheckpointOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Kind != checkpoint.KindMemoryDisk {
		t.Fatalf("checkpoint kind %s, want memory+disk", cp.Kind)
	}
	if err := e.m.Sleep(ctx, "v", false); err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Host, VMM       string
		SnapshotVersion string   `json:"snapshot_version"`
		CPUFlags        []string `json:"cpu_flags"`
	}
	data, err := os.ReadFile(filepath.Join(e.hostDir(storage.SuspendDir("v")), machine.HostFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Host != "host-a" || rec.VMM != "fake" || rec.SnapshotVersion != "1.0" || len(rec.CPUFlags) == 0 {
		t.Fatalf("the suspend slot's host record: %s", data)
	}
	if _, err := os.Stat(filepath.Join(e.hostDir(checkpoint.Dir("v", cp.ID).Join(checkpoint.VMMDir)), machine.HostFile)); err != nil {
		t.Fatalf("the checkpoint records no host: %v", err)
	}

	e.drv.SetVersion("2.0")
	err = e.m.Wake(ctx, "v")
	if err == nil || !errors.Is(err, machine.ErrConflict) || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), "taken by fake 1.0 on host host-a") {
		t.Fatalf("wake under another VMM version: %v", err)
	}
	e.wantState("v", registry.StateSleeping)

	e.drv.SetVersion("1.0")
	if err := e.m.Wake(ctx, "v"); err != nil {
		t.Fatalf("wake under the VMM that took it: %v", err)
	}
	e.wantState("v", registry.StateRunning)

	e.drv.SetVersion("2.0")
	before := e.record("v")
	_, err = e.m.Restore(ctx, "v", cp.ID, machine.RestoreOptions{}, nil)
	if err == nil || !errors.Is(err, machine.ErrConflict) || !strings.Contains(err.Error(), "does not read that version's snapshots") {
		t.Fatalf("restore under another VMM version: %v", err)
	}
	after := e.wantState("v", registry.StateRunning)
	if after.Generation != before.Generation {
		t.Fatalf("a refused restore changed the record: generation %d, was %d", after.Generation, before.Generation)
	}
	cps, _, err := e.m.Checkpoints(ctx, "v")
	if err != nil || len(cps) != 1 {
		t.Fatalf("a refused restore saved the state first: %d checkpoints (%v)", len(cps), err)
	}

	// Under the new version the VM sleeps and wakes, as the next
	// snapshot records it.
	if err := e.m.Sleep(ctx, "v", false); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Wake(ctx, "v"); err != nil {
		t.Fatalf("wake of a snapshot taken under this version: %v", err)
	}
}
