package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/memstore"
)

// objectBytes is what the daemon's volume's object store holds, once it
// stopped changing (a block written may still be on its way).
func (d *daemon) objectBytes() int64 {
	d.t.Helper()
	size := func() int64 {
		var n int64
		dir := d.objects
		if dir == "" {
			dir = filepath.Join(d.state, "juicefs", "objects")
		}
		_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				if info, err := e.Info(); err == nil {
					n += info.Size()
				}
			}
			return nil
		})
		return n
	}
	last := size()
	eventually(30*time.Second, func() bool {
		time.Sleep(500 * time.Millisecond)
		n := size()
		same := n == last
		last = n
		return same
	})
	return last
}

// waitPacksOlder waits until every file in the memory store's packs
// directory was last written more than grace ago (the daemon's
// --gc-grace): a collection then keeps no pack for its grace period.
// The daemon reads the same files' times on the same clock.
func (d *daemon) waitPacksOlder(grace time.Duration) {
	d.t.Helper()
	dir := d.volumePath("memstore", "packs")
	var young string
	old := func() bool {
		ents, err := os.ReadDir(dir)
		if err != nil {
			young = err.Error()
			return false
		}
		for _, e := range ents {
			info, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // collected meanwhile
			}
			if err != nil {
				young = err.Error()
				return false
			}
			if age := time.Since(info.ModTime()); age <= grace {
				young = fmt.Sprintf("%s is %v old", e.Name(), age)
				return false
			}
		}
		return true
	}
	if !eventually(30*time.Second+grace, old) {
		d.t.Fatalf("the memory store's packs are not all older than %v after %v: %s", grace, 30*time.Second+grace, young)
	}
}

func (d *daemon) storage() api.Storage {
	d.t.Helper()
	var st api.Storage
	if err := json.Unmarshal([]byte(d.must("df", "--json")), &st); err != nil {
		d.t.Fatal(err)
	}
	return st
}

func vmStorage(t *testing.T, st api.Storage, name string) api.VMStorage {
	t.Helper()
	for _, v := range st.VMs {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("den df has no %s: %+v", name, st)
	return api.VMStorage{}
}

// manifestOf reads the memory manifest of a checkpoint.
func (d *daemon) manifestOf(vm, id string) *memstore.Manifest {
	d.t.Helper()
	m, err := memstore.ReadManifest(d.volumePath("vms", vm, "checkpoints", id, "vmm"))
	if err != nil {
		d.t.Fatal(err)
	}
	return m
}

const mib = 1 << 20

// TestMemoryCheckpointCosts: memory checkpoints of an idle 512 MiB VM
// store what changed, not the RAM: the volume's object store grows by
// less than 10 MiB per checkpoint over 100 of them; 64 MiB of new data
// costs about 64 MiB.
func TestMemoryCheckpointCosts(t *testing.T) {
	d := startDaemon(t)
	d.must("create", "box", "--memory", "512M", "--idle-timeout", "0")
	d.must("checkpoint", "box") // the first after the create
	before := d.objectBytes()
	const n = 100
	for range n {
		d.must("checkpoint", "box")
	}
	grew := d.objectBytes() - before
	t.Logf("%d memory checkpoints of an idle 512 MiB VM: the object store grew %.1f MiB, %.2f MiB each", n, float64(grew)/mib, float64(grew)/n/mib)
	if grew/n >= 10*mib {
		t.Fatalf("each idle checkpoint stored %.1f MiB on average, want under 10", float64(grew)/n/mib)
	}

	before = d.objectBytes()
	d.must("exec", "box", "--", "sh", "-c", "head -c 67108864 /dev/urandom > /dev/shm/new")
	d.must("checkpoint", "box")
	grew = d.objectBytes() - before
	t.Logf("a checkpoint after 64 MiB of new data: the object store grew %.1f MiB", float64(grew)/mib)
	if grew < 60*mib || grew > 96*mib {
		t.Fatalf("a checkpoint after 64 MiB of new data stored %.1f MiB, want about 64", float64(grew)/mib)
	}
}

// TestMemorySharedAndDamaged: two VMs from one warm base, and a fork and
// its source, store their unchanged memory once; a flipped byte in an
// extent they share is found by verify, marks every checkpoint that
// names it, and each is refused on restore. A VM asleep on memory that
// shares it, with no local copy of it, is refused its wake (the fill of
// its RAM checks each extent) and stays asleep.
func TestMemorySharedAndDamaged(t *testing.T) {
	d := startDaemon(t)
	for _, vm := range []string{"a", "b"} {
		d.must("create", vm, "--memory", "256M", "--idle-timeout", "0")
		d.must("checkpoint", vm)
	}
	d.must("create", "s", "--memory", "256M", "--idle-timeout", "0")
	d.must("sleep", "s")
	ms, err := memstore.ReadManifest(d.volumePath("vms", "s", "suspend"))
	if err != nil {
		t.Fatal(err)
	}
	d.must("fork", "a@cp-1", "c")
	d.must("checkpoint", "c")
	st := d.storage()
	var named int64
	for _, name := range []string{"a", "b", "c"} {
		v := vmStorage(t, st, name)
		t.Logf("%s: %.1f MiB referenced, %.1f MiB its own", name, float64(v.Referenced)/mib, float64(v.Unique)/mib)
		if v.Referenced == 0 || v.Unique*2 > v.Referenced {
			t.Fatalf("%s holds %d of its %d bytes alone: its unchanged memory is not shared", name, v.Unique, v.Referenced)
		}
		named += v.Referenced
	}
	named += st.Bases.Referenced
	if st.Live*2 > named {
		t.Fatalf("the store holds %d bytes live for %d bytes the snapshots name: not stored once", st.Live, named)
	}

	// An extent that a@cp-1, b@cp-1 and the memory s slept with all
	// name (the base's).
	ma, mb := d.manifestOf("a", "cp-1"), d.manifestOf("b", "cp-1")
	inB, inS := map[memstore.Digest]bool{}, map[memstore.Digest]bool{}
	for _, e := range mb.Extents {
		inB[e.Digest] = true
	}
	for _, e := range ms.Extents {
		inS[e.Digest] = true
	}
	var shared memstore.Digest
	for _, e := range ma.Extents {
		if inB[e.Digest] && inS[e.Digest] {
			shared = e.Digest
			break
		}
	}
	store, err := memstore.Open(d.volumePath("memstore"))
	if err != nil {
		t.Fatal(err)
	}
	name, at, ok := store.Locate(shared)
	if shared == (memstore.Digest{}) || !ok {
		t.Fatal("a@cp-1, b@cp-1 and s's suspend slot share no extent the store holds")
	}
	f, err := os.OpenFile(d.volumePath("memstore", "packs", name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, at+100); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, at+100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if out, err := d.run("checkpoint", "verify", "a", "cp-1"); err == nil || !strings.Contains(out+stderrOf(err), "damaged") {
		t.Fatalf("verify of a checkpoint with a flipped byte: %v: %s", err, out)
	}
	for _, vm := range []string{"a", "b"} {
		var cps []struct {
			ID      string `json:"id"`
			Damaged string `json:"damaged"`
		}
		if err := json.Unmarshal([]byte(d.must("checkpoints", vm, "--json")), &cps); err != nil {
			t.Fatal(err)
		}
		if len(cps) == 0 || cps[0].Damaged == "" {
			t.Fatalf("%s@cp-1 shares the damaged extent and is not marked: %+v", vm, cps)
		}
		if _, err := d.run("restore", vm, "cp-1", "--no-save"); err == nil || !strings.Contains(stderrOf(err), "damaged") {
			t.Fatalf("restore of %s@cp-1, which names a damaged extent: %v", vm, err)
		}
	}
	d.kill() // local copies of memory go with a restart
	d.start()
	if _, err := d.run("wake", "s"); err == nil || !strings.Contains(stderrOf(err), "damaged") || !strings.Contains(stderrOf(err), "it stays asleep") {
		t.Fatalf("wake of s, asleep on memory that names a damaged extent: %v", err)
	}
	if vm := d.info("s"); vm.State != "sleeping" {
		t.Fatalf("s after its wake was refused: %+v", vm)
	}
}

// TestMemoryChainRestores: every other checkpoint of a chain of 30 goes,
// the store is collected, the daemon restarts (no local copies of
// memory left): every checkpoint left restores exactly (a RAM-resident
// file's hash).
func TestMemoryChainRestores(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--gc-grace", "1s"} })
	d.must("create", "chain", "--memory", "256M", "--idle-timeout", "0")
	sums := map[string]string{}
	for i := 1; i <= 30; i++ {
		sums[fmt.Sprintf("cp-%d", i)] = d.must("exec", "chain", "--", "sh", "-c", "head -c 1048576 /dev/urandom > /dev/shm/mark; md5sum /dev/shm/mark")
		d.must("checkpoint", "chain")
	}
	for i := 2; i <= 30; i += 2 {
		d.must("checkpoint", "rm", "chain", fmt.Sprintf("cp-%d", i))
		delete(sums, fmt.Sprintf("cp-%d", i))
	}
	d.waitPacksOlder(time.Second) // past the grace period of the last pack written
	var gc api.GCResult
	if err := json.Unmarshal([]byte(d.must("gc", "--json")), &gc); err != nil {
		t.Fatal(err)
	}
	if gc.Removed == 0 {
		t.Fatalf("den gc removed nothing after 15 checkpoints went: %+v", gc)
	}
	d.kill()
	d.start()
	if ents, _ := os.ReadDir(filepath.Join(d.state, "memory", "chain")); len(ents) > 0 {
		t.Fatalf("local copies of memory outlived the restart: %d", len(ents))
	}
	for i := 1; i <= 30; i += 2 {
		id := fmt.Sprintf("cp-%d", i)
		d.must("restore", "chain", id, "--no-save")
		if got := d.must("exec", "chain", "--", "md5sum", "/dev/shm/mark"); got != sums[id] {
			t.Fatalf("%s restored to %q, want %q", id, got, sums[id])
		}
	}
}

// TestMemoryStoreCrashes kills the daemon in the extent write (a pack
// synced, its manifest not written), after a manifest was written (the
// checkpoint not committed), in a reference drop (a checkpoint's
// deletion), and in a collection (after it chose what goes, and after
// it removed a pack). After each restart every checkpoint listed
// verifies and restores, and no extent a snapshot names is missing.
func TestMemoryStoreCrashes(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--gc-grace", "1s"} })
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	sums := map[string]string{} // each checkpoint's RAM-resident file's hash
	mark := func() string {
		return d.must("exec", "box", "--", "sh", "-c", "head -c 4194304 /dev/urandom > /dev/shm/mark; md5sum /dev/shm/mark")
	}
	take := func() {
		sum := mark()
		id := strings.TrimSpace(d.must("checkpoint", "box", "--json"))
		var cp struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(id), &cp); err != nil {
			t.Fatalf("checkpoint --json: %v: %q", err, id)
		}
		sums[cp.ID] = sum
	}
	for range 4 {
		take()
	}
	check := func(step string) {
		t.Helper()
		if out, err := d.run("checkpoint", "verify", "box", "--all"); err != nil {
			t.Fatalf("%s: verify: %v: %s%s", step, err, out, stderrOf(err))
		}
		for _, cp := range d.checkpoints("box") {
			want, ok := sums[cp.ID]
			if !ok {
				continue // the state a restore saved
			}
			d.must("restore", "box", cp.ID, "--no-save")
			if got := d.must("exec", "box", "--", "md5sum", "/dev/shm/mark"); got != want {
				t.Fatalf("%s: %s restored to %q, want %q", step, cp.ID, got, want)
			}
		}
		mark()
	}
	d.crashAt("memstore-pack-written", "checkpoint", "box")
	check("a crash after a pack was written")
	d.crashAt("checkpoint-after-snapshot", "checkpoint", "box")
	check("a crash after a manifest was written")
	take()
	d.crashAt("checkpoint-rm-after-retire", "checkpoint", "rm", "box", "cp-2")
	check("a crash in a checkpoint's deletion")
	// A collection that crashes: the checkpoint goes just before it, on
	// the daemon set to crash (the background collection waits a few
	// seconds after a deletion; den gc runs at once).
	crashGC := func(point, id string) {
		t.Helper()
		d.kill()
		d.env = []string{"DEN_CRASHPOINT=" + point}
		d.start()
		d.must("checkpoint", "rm", "box", id)
		delete(sums, id)
		// A pack no manifest names, as a crash in a checkpoint leaves
		// one: there is something to remove, whatever the background
		// collection took already.
		orphan := d.volumePath("memstore", "packs", fmt.Sprintf("%032x", time.Now().UnixNano()))
		if err := os.WriteFile(orphan, make([]byte, memstore.ExtentSize), 0o600); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(orphan, old, old); err != nil {
			t.Fatal(err)
		}
		if out, err := d.run("gc"); err == nil {
			t.Fatalf("den gc went through the crash point %s: %q", point, out)
		}
		d.waitExit()
		d.env = nil
		d.start()
	}
	crashGC("memstore-collect-listed", "cp-1")
	check("a crash in a collection that chose what goes")
	take()
	crashGC("memstore-collect-removed", "cp-3")
	check("a crash in a collection that removed a pack")
}

// TestCollectRacingCheckpoints: collections with a grace period of a
// second race four VMs from one base checkpointing at once (their
// memory shares the base's extents) while older checkpoints go:
// nothing a checkpoint names is removed.
func TestCollectRacingCheckpoints(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--gc-grace", "1s"} })
	vms := []string{"v1", "v2", "v3", "v4"}
	for _, vm := range vms {
		d.must("create", vm, "--memory", "256M", "--idle-timeout", "0")
	}
	stop := make(chan struct{})
	var gcs sync.WaitGroup
	gcs.Add(1)
	go func() {
		defer gcs.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := d.run("gc"); err != nil && !strings.Contains(stderrOf(err), "changed") {
				t.Errorf("gc: %v", err)
				return
			}
		}
	}()
	for round := 1; round <= 3; round++ {
		var w sync.WaitGroup
		for _, vm := range vms {
			w.Add(1)
			go func() {
				defer w.Done()
				if _, err := d.run("exec", vm, "--", "sh", "-c", "head -c 2097152 /dev/urandom > /dev/shm/mark"); err != nil {
					t.Error(err)
				}
				if _, err := d.run("checkpoint", vm); err != nil {
					t.Error(err)
				}
				if round > 1 {
					if _, err := d.run("checkpoint", "rm", vm, fmt.Sprintf("cp-%d", round-1)); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		w.Wait()
	}
	close(stop)
	gcs.Wait()
	if t.Failed() {
		return
	}
	d.waitPacksOlder(time.Second)
	d.must("gc")
	for _, vm := range vms {
		if out, err := d.run("checkpoint", "verify", vm, "--all"); err != nil {
			t.Fatalf("verify %s after the race: %v: %s%s", vm, err, out, stderrOf(err))
		}
		want := d.must("exec", vm, "--", "md5sum", "/dev/shm/mark")
		d.must("restore", vm, "cp-3", "--no-save")
		if got := d.must("exec", vm, "--", "md5sum", "/dev/shm/mark"); got != want {
			t.Fatalf("%s restored to %q, want %q", vm, got, want)
		}
	}
}

// TestCheckpointSchedule: a schedule takes checkpoints while the VM
// runs and none while it sleeps, keeps what its retention says (and
// checkpoints taken by hand), and what it drops is freed by the
// collection: 32 MiB the guest wrote and then zeroed go with the
// scheduled checkpoint that held them.
func TestCheckpointSchedule(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--gc-grace", "1s"} })
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	d.must("checkpoint", "box", "-m", "by hand") // cp-1
	d.must("exec", "box", "--", "sh", "-c", "head -c 33554432 /dev/urandom > /dev/shm/big")
	d.must("checkpoint", "schedule", "box", "--every", "2s", "--keep", "2")
	type sched struct {
		Schedule *struct {
			Taken []string `json:"taken"`
		} `json:"schedule"`
	}
	read := func() []string {
		var s sched
		if err := json.Unmarshal([]byte(d.must("checkpoint", "schedule", "box", "--json")), &s); err != nil || s.Schedule == nil {
			t.Fatalf("schedule: %v %+v", err, s)
		}
		return s.Schedule.Taken
	}
	newest := func() int {
		taken := read()
		if len(taken) == 0 {
			return 0
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(taken[len(taken)-1], "cp-"))
		return n
	}
	if !eventually(3*time.Minute, func() bool { return newest() >= 2 }) {
		t.Fatalf("no scheduled checkpoint: %v", read())
	}
	// The 32 MiB are in cp-2's memory, then zeros.
	held := d.manifestOf("box", "cp-2")
	d.must("exec", "box", "--", "sh", "-c", "dd if=/dev/zero of=/dev/shm/big bs=1M count=32 conv=notrunc 2>/dev/null")
	// Two more after the newest that may have taken the 32 MiB: that one
	// and all before it are dropped.
	last := newest() + 3
	if !eventually(3*time.Minute, func() bool { return newest() >= last }) {
		t.Fatalf("the schedule took too few checkpoints: %v", read())
	}
	taken := read()
	ids := map[string]bool{}
	for _, cp := range d.checkpoints("box") {
		ids[cp.ID] = true
	}
	if len(taken) != 2 || !ids["cp-1"] || ids["cp-2"] || len(ids) != 3 {
		t.Fatalf("the schedule keeps %v; the checkpoints are %v: want cp-1 and the newest 2", taken, ids)
	}
	for _, id := range taken {
		if !ids[id] {
			t.Fatalf("the schedule keeps %s, which is not listed: %v", id, ids)
		}
	}

	// No checkpoint while it sleeps.
	d.must("sleep", "box")
	asleep := read()
	time.Sleep(6 * time.Second) // three intervals: a checkpoint would be due thrice
	if now := read(); !slices.Equal(now, asleep) {
		t.Fatalf("checkpoints taken while the vm slept: %v, then %v", asleep, now)
	}

	// What the retention dropped is freed: the extents only cp-2 named.
	d.must("gc")
	live := map[memstore.Digest]bool{}
	paths, err := memstore.FindManifests(d.volumePath("vms"), d.volumePath("images"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		m, err := memstore.ReadManifest(filepath.Dir(p))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range m.Extents {
			live[e.Digest] = true
		}
	}
	store, err := memstore.Open(d.volumePath("memstore"))
	if err != nil {
		t.Fatal(err)
	}
	var dead, kept int
	for _, e := range held.Extents {
		if live[e.Digest] {
			continue
		}
		dead++
		if _, _, ok := store.Locate(e.Digest); ok {
			kept++
		}
	}
	t.Logf("cp-2 alone held %d extents (%d MiB); %d still stored after the collection", dead, dead*memstore.ExtentSize/mib, kept)
	if dead*memstore.ExtentSize < 28*mib || kept > dead/10 {
		t.Fatalf("cp-2 alone held %d extents; %d of them are still stored after the collection", dead, kept)
	}
	d.must("checkpoint", "schedule", "box", "--off")
	if out := d.must("checkpoint", "schedule", "box"); !strings.Contains(out, "no checkpoint schedule") {
		t.Fatalf("after --off: %q", out)
	}
}

// TestOldLayoutRestores: checkpoints whose memory is a file of its own
// (a volume from before memory was stored by content) still restore
// after the daemon stores memory by content, and a checkpoint taken after
// such a restore is stored by content and restores too.
func TestOldLayoutRestores(t *testing.T) {
	d := startDaemonIn(t, func(string) []string { return []string{"--memory-files"} })
	d.must("create", "box", "--memory", "256M", "--idle-timeout", "0")
	old := d.must("exec", "box", "--", "sh", "-c", "head -c 1048576 /dev/urandom > /dev/shm/mark; md5sum /dev/shm/mark")
	d.must("checkpoint", "box") // cp-1, its memory a file
	if _, err := os.Stat(d.volumePath("vms", "box", "checkpoints", "cp-1", "vmm", "memory")); err != nil {
		t.Fatalf("--memory-files wrote no memory file: %v", err)
	}
	d.kill()
	d.extraArgs = slices.DeleteFunc(d.extraArgs, func(a string) bool { return a == "--memory-files" })
	d.start()
	d.must("restore", "box", "cp-1", "--no-save")
	if got := d.must("exec", "box", "--", "md5sum", "/dev/shm/mark"); got != old {
		t.Fatalf("cp-1 (a memory file) restored to %q, want %q", got, old)
	}
	sum := d.must("exec", "box", "--", "sh", "-c", "head -c 1048576 /dev/urandom > /dev/shm/mark; md5sum /dev/shm/mark")
	d.must("checkpoint", "box") // cp-2, by content
	if _, err := memstore.ReadManifest(d.volumePath("vms", "box", "checkpoints", "cp-2", "vmm")); err != nil {
		t.Fatalf("cp-2 is not stored by content: %v", err)
	}
	d.must("restore", "box", "cp-1", "--no-save")
	d.must("restore", "box", "cp-2", "--no-save")
	if got := d.must("exec", "box", "--", "md5sum", "/dev/shm/mark"); got != sum {
		t.Fatalf("cp-2 restored to %q, want %q", got, sum)
	}
	if out, err := d.run("checkpoint", "verify", "box", "--all"); err != nil {
		t.Fatalf("verify both layouts: %v: %s%s", err, out, stderrOf(err))
	}
}
