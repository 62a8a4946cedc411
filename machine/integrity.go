package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// ErrDamaged: a checkpoint, suspend slot or warm base does not match its
// digests; nothing was restored from it.
var ErrDamaged = checkpoint.ErrDamaged

// snapshotRef is a sealed directory a VM is brought up from.
type snapshotRef struct {
	dir  storage.Path
	what string // `checkpoint cp-3 of "box"`, for messages
	// vm and id name a checkpoint, which is marked damaged on a mismatch.
	vm, id string
	// seal is the seal id recorded for it ("" for none: a snapshot from
	// before digests, or a warm base).
	seal string
	// disk: dir holds a disk (a checkpoint or a warm base); a suspend
	// slot holds only the VMM's snapshot.
	disk bool
	// local is a local copy of the snapshot's memory file (memcopy.go),
	// read and checked in place of the volume's; "" for none.
	local string
	// filled: the restore that follows the verification fills the
	// guest's RAM with the memory kept by content, checking every extent
	// against its digest as it reads it (memstore.Fill), whenever no
	// local copy stands in: the verification leaves the store's extents
	// to it, rather than read them twice.
	filled bool
}

func checkpointRef(cp registry.Checkpoint) snapshotRef {
	return snapshotRef{dir: checkpoint.Dir(cp.VM, cp.ID), what: fmt.Sprintf("checkpoint %s of %q", cp.ID, cp.VM),
		vm: cp.VM, id: cp.ID, seal: cp.Seal, disk: true}
}

func suspendRef(vm, seal string) snapshotRef {
	return snapshotRef{dir: storage.SuspendDir(vm), what: fmt.Sprintf("the memory %q slept with", vm), vm: vm, seal: seal}
}

// The verification policy (docs/reliability.md, "Integrity"), from what
// reading costs here: the small files (device state, VMM config) are
// always read whole (a few ms). The memory's extents that held data when
// sealed are read whole before the guest runs (with a sample of its zero
// ones) when the VMM reads all of it to restore anyway (QEMU copies the
// data extents into the guest's RAM file, and the copy then comes from
// the page cache); where the VMM maps it lazily (Cloud Hypervisor
// OnDemand), only
// the first, the last and lazySample other extents are read before, and a
// background pass reads the rest while the guest runs, stopping the VM if
// it finds damage. A checkpoint's disk (gigabytes, mostly read by nobody)
// is sampled: the first, the last and diskSample other extents;
// `den checkpoint verify` checks everything: it reads the data, and the
// holes the volume maps are checked as zeros unread (dataRanges).
const (
	diskSample = 2
	lazySample = 8
)

// sealPace paces background digests: they rest as long as they work, so
// that they take at most about half of one core and of the volume's
// reads (a 4 GiB disk was about 2 s of reading through FUSE here, holes
// included; its data alone, 60-200 MiB, is what a seal reads now), and
// they wait while any operation holds a VM (a wake, a checkpoint...): a
// digest is never on an operation's critical path, nor competes with
// one. The wait is bounded (sealYieldMax), so a host never idle still
// gets its digests. Once a host shutdown or a stop began they neither
// rest nor wait: the shutdown waits for the digests of the memory of the
// VMs it put to sleep (which its own hold on them would otherwise
// stall), and a cluster host's stop for those under way.
func (g *integrity) sealPace() checkpoint.Pace {
	idle := 1.0
	if g.m.hostDown.Load() || isClosed(g.m.closed) {
		idle = 0
	}
	return checkpoint.Pace{Idle: idle, Yield: g.sealYield}
}

const (
	sealYieldMax = time.Minute
	// sealYieldStep is how often a yielding seal looks whether a host
	// shutdown began.
	sealYieldStep = 250 * time.Millisecond
)

// sealYield waits (at most sealYieldMax) until no operation holds a
// VM, and not at all once a host shutdown began.
func (g *integrity) sealYield(ctx context.Context) {
	deadline := time.Now().Add(sealYieldMax)
	for !g.m.hostDown.Load() && !isClosed(g.m.closed) {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		g.m.locks.waitQuiet(ctx, 0, min(left, sealYieldStep))
		g.m.mu.Lock()
		busy := len(g.m.holders) > 0
		g.m.mu.Unlock()
		if !busy {
			return
		}
	}
}

// policy is what verification reads of ref before a VMM restores it.
func (g *integrity) policy(ref snapshotRef, lazy bool) checkpoint.Policy {
	p := checkpoint.Policy{Seal: ref.seal, Sealing: g.m.seal.busy(ref.dir), Local: ref.localFiles()}
	p.ReadDir, _ = g.m.vol.ReadPath(ref.dir) // reads that leave clones as they are
	switch {
	case lazy:
		p.Sample = lazySample
	case !ref.disk:
		p.Whole, p.Sample, p.DataOnly = []string{""}, diskSample, true
	default:
		p.Whole, p.Sample, p.DataOnly = []string{checkpoint.VMMDir + "/"}, diskSample, true
	}
	return p
}

// lazyRestore says whether restores map memory lazily.
func (g *integrity) lazyRestore(vmmName string) bool {
	return g.m.vmms.caps(vmmName).OnDemandRestore && !g.m.cfg.RestoreCopy
}

// verify checks ref against its digests, as the policy for vmmName says,
// before anything is restored from it. A mismatch marks a checkpoint
// damaged and is refused; a snapshot without digests (taken before den
// kept them, with no seal recorded) is used with a log line.
func (g *integrity) verify(ctx context.Context, ref snapshotRef, vmmName string) error {
	if g.m.cfg.NoDigests {
		return nil
	}
	host, err := g.m.vol.Path(ref.dir)
	if err != nil {
		return err
	}
	end := phase.Begin(ctx, "verify: the snapshot's files")
	_, err = checkpoint.Verify(ctx, host, g.policy(ref, g.lazyRestore(vmmName)))
	end()
	var dmg *checkpoint.DamageError
	if ref.local != "" && errors.As(err, &dmg) && dmg.File == ref.memoryRel() {
		// The local copy is damaged, not the snapshot: it goes, and
		// the volume's copy is checked (and then read) instead.
		g.m.log.Warn("den: a local memory copy failed verification: dropped", "snapshot", ref.what, "err", err)
		_ = os.Remove(ref.local)
		ref.local = ""
		_, err = checkpoint.Verify(ctx, host, g.policy(ref, g.lazyRestore(vmmName)))
	}
	if err == nil || errors.Is(err, checkpoint.ErrUnsealed) {
		end := phase.Begin(ctx, "verify: the memory kept by content")
		if kerr := g.verifyKept(ctx, &ref, host); kerr != nil {
			err = kerr
		}
		end()
	}
	if errors.Is(err, checkpoint.ErrUnsealed) {
		g.m.log.Info("den: restoring a snapshot without digests", "snapshot", ref.what)
		return nil
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return g.failed(ref, err)
	}
	return nil
}

// failed is the error of ref's failed verification (or of a fill that
// found it damaged), which it marks on a checkpoint and logs.
func (g *integrity) failed(ref snapshotRef, err error) error {
	err = checkpoint.VerifyError(ref.what, err)
	if errors.Is(err, checkpoint.ErrDamaged) && ref.id != "" {
		if merr := g.m.snaps.store().MarkDamaged(ref.vm, ref.id, err.Error()); merr != nil {
			g.m.log.Warn("den: mark a checkpoint damaged", "vm", ref.vm, "checkpoint", ref.id, "err", merr)
		}
	}
	g.m.log.Error("den: snapshot failed verification", "snapshot", ref.what, "err", err)
	return err
}

// verifyRunning reads, after a lazy restore, what verify sampled, and
// stops the VM if its memory came from a damaged snapshot: it has run on
// that memory only since the restore.
func (g *integrity) verifyRunning(in *instance, ref snapshotRef, vmmName string) {
	if g.m.cfg.NoDigests || !g.lazyRestore(vmmName) {
		return
	}
	g.m.goBackground(func() {
		ctx, cancel := g.m.lifetime()
		defer cancel()
		host, err := g.m.vol.Path(ref.dir)
		if err != nil {
			return
		}
		p := g.policy(ref, false)
		p.Full, p.Data = true, g.dataRanges(ctx)
		_, err = checkpoint.Verify(ctx, host, p)
		if err == nil || !errors.Is(err, checkpoint.ErrDamaged) {
			return
		}
		err = checkpoint.VerifyError(ref.what, err)
		unlock, lerr := g.m.locks.lockVM(ctx, in.name, "stop a vm restored from a damaged snapshot")
		if lerr != nil {
			g.m.log.Error("den: a vm runs on memory that failed verification, and could not be stopped", "vm", in.name, "err", err, "lock", lerr)
			return
		}
		defer unlock()
		if ref.id != "" {
			if _, gerr := g.m.db.GetCheckpoint(ctx, ref.vm, ref.id); gerr != nil {
				return // deleted meanwhile: its files went, not bad
			}
			_ = g.m.snaps.store().MarkDamaged(ref.vm, ref.id, err.Error())
		}
		g.m.log.Error("den: a vm runs on memory that failed verification: stopping it", "vm", in.name, "err", err)
		if g.m.procs.instance(in.name) == in {
			in.close(true)
			g.m.procs.stopInstance(ctx, in, stopQuit)
			g.m.procs.recordStopped(ctx, in.name, "stopped: "+err.Error()+"; restore another checkpoint (den checkpoints), or start it from its disk")
		}
	})
}

// sealer digests snapshots' large files in the background, one at a
// time, off the critical path of checkpoint and sleep.
type sealer struct {
	mu      sync.Mutex // one seal at a time
	pmu     sync.Mutex
	pending map[storage.Path]int // directories queued or being sealed
	// unsealed are the directories whose last seal was cut short or
	// failed: their digests are missing.
	unsealed map[storage.Path]bool
}

// left records how dir's seal ended: with its digests missing or not.
func (s *sealer) left(dir storage.Path, missing bool) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if !missing {
		delete(s.unsealed, dir)
		return
	}
	if s.unsealed == nil {
		s.unsealed = map[storage.Path]bool{}
	}
	s.unsealed[dir] = true
}

// unsealedUnder says whether a directory under root was left without
// its digests by a seal cut short or failed.
func (s *sealer) unsealedUnder(root storage.Path) bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	for dir := range s.unsealed {
		if under(dir, root) {
			return true
		}
	}
	return false
}

// under says whether dir is root or in it.
func under(dir, root storage.Path) bool {
	return dir == root || strings.HasPrefix(string(dir), string(root)+"/")
}

func (s *sealer) add(dir storage.Path, n int) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.pending == nil {
		s.pending = map[storage.Path]int{}
	}
	if s.pending[dir] += n; s.pending[dir] <= 0 {
		delete(s.pending, dir)
	}
}

// busyUnder says whether the digests of a directory under root are
// queued or being written.
func (s *sealer) busyUnder(root storage.Path) bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	for dir, n := range s.pending {
		if n > 0 && under(dir, root) {
			return true
		}
	}
	return false
}

// any says whether any digests are queued or being written.
func (s *sealer) any() bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return len(s.pending) > 0
}

// busy says whether dir's digests are queued or being written.
func (s *sealer) busy(dir storage.Path) bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.pending[dir] > 0
}

// goBackground runs f in the background unless the Manager is closed;
// Close waits for it.
func (m *Manager) goBackground(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.closed:
		return false
	default:
	}
	m.background.Add(1)
	go func() {
		defer m.background.Done()
		f()
	}()
	return true
}

// inBackground is goBackground for f that runs for as long as den does:
// its ctx ends when den closes.
func (m *Manager) inBackground(f func(ctx context.Context)) bool {
	return m.goBackground(func() {
		ctx, cancel := m.lifetime()
		defer cancel()
		f(ctx)
	})
}

// verifyTraced is verify as a step of the operation ctx traces.
func (g *integrity) verifyTraced(ctx context.Context, ref snapshotRef, vmmName string) error {
	defer phase.Begin(ctx, "verify")()
	return g.verify(ctx, ref, vmmName)
}

// dataRanges tells the digests which ranges of a file hold data, so that
// they skip reading its holes: the volume's chunk maps for its files, the
// local filesystem's (SEEK_DATA) for local copies. Only whole reads use
// it (seals, full verifications), where a checkpoint's disk is gigabytes
// of holes read through FUSE; a restore's verification reads a sample.
func (g *integrity) dataRanges(ctx context.Context) checkpoint.DataRanges {
	return func(path string) ([]sparse.Extent, bool) {
		for _, root := range []string{g.m.vol.ReadRoot(), g.m.vol.Root()} {
			rel, err := filepath.Rel(root, path)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				continue
			}
			ext, err := g.m.vol.DataRanges(ctx, storage.Path(filepath.ToSlash(rel)))
			if err != nil {
				g.m.log.Debug("den: data ranges: reading the file whole", "file", path, "err", err)
			}
			return ext, err == nil
		}
		ext, ok, err := sparse.DataRanges(path)
		return ext, ok && err == nil
	}
}

// lowPriority puts the calling goroutine on a thread of its own at the
// lowest CPU priority, for background work (digests, removals). The
// thread is never unlocked, so it ends with the goroutine rather than go
// back to Go's pool niced.
func lowPriority() {
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
}

// sealLater digests dir's large files in the background, reading the
// local copies ref names (snapshotRef.localFiles) if dir still holds
// ref's snapshot when the seal runs.
func (g *integrity) sealLater(dir storage.Path, ref snapshotRef) {
	if g.m.cfg.NoDigests {
		return
	}
	g.m.seal.add(dir, 1)
	if !g.m.goBackground(func() { g.sealNow(dir, ref.seal, ref.localFiles()) }) {
		g.m.seal.add(dir, -1)
	}
}

// sealDelay holds every seal back before it reads anything: 0 but in
// tests, which make digests take long.
var sealDelay time.Duration

// sealNow digests dir's large files, after any seal under way. A seal
// that fails leaves them without digests, which verification then
// reports (the snapshot is recorded with its seal).
func (g *integrity) sealNow(dir storage.Path, localSeal string, local map[string]string) {
	defer g.m.seal.add(dir, -1)
	g.m.seal.mu.Lock()
	defer g.m.seal.mu.Unlock()
	// It ends with the digests (endDigests): a cluster host's Close lets
	// it finish first.
	ctx, cancel := until(g.m.digestsEnd)
	defer cancel()
	// Until it is written, or there is nothing to write, the snapshot is
	// left without digests: one cut short by a stop, or failed.
	done := false
	defer func() { g.m.seal.left(dir, !done) }()
	// The digests run at the lowest CPU priority: the VMs, and den's own
	// work for them, come first.
	lowPriority()
	host, err := g.m.vol.Path(dir)
	if err != nil {
		return
	}
	start := time.Now()
	if sealDelay > 0 {
		select {
		case <-time.After(sealDelay):
		case <-ctx.Done():
			return
		}
	}
	pace := g.sealPace()
	pace.Data = g.dataRanges(ctx)
	for try := 1; ; try++ {
		pace.ReadDir, _ = g.m.vol.ReadPath(dir) // the read-only mount may have gone since the last try
		err := checkpoint.Seal(ctx, host, pace, localSeal, local)
		if err == nil {
			g.m.log.Debug("den: snapshot digested", "dir", string(dir), "took", time.Since(start))
			done = true
			return
		}
		if ctx.Err() != nil {
			return // den is stopping
		}
		if errors.Is(err, checkpoint.ErrUnsealed) || notExist(err) {
			done = true
			return // no snapshot there any more
		}
		g.m.log.Warn("den: digest a snapshot", "dir", string(dir), "try", try, "err", err)
		if try == 3 {
			g.m.log.Error("den: a snapshot is left without digests of its memory and disk: restoring it will be refused as damaged", "dir", string(dir))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(try) * 2 * time.Second):
		}
	}
}

// sealSmall digests a new snapshot's small files (in its final or
// temporary directory) before it is put in place.
func (g *integrity) sealSmall(ctx context.Context, dir storage.Path) (string, error) {
	if g.m.cfg.NoDigests {
		return "", nil
	}
	host, err := g.m.vol.Path(dir)
	if err != nil {
		return "", err
	}
	man, err := checkpoint.SealSmall(ctx, host)
	return man.Seal, err
}

// sealPending queues, after a restart, the snapshots whose large files a
// stop interrupted the digests of. A VM a host shutdown put to sleep
// whose memory got no digests before den stopped is not woken by the
// boot wake (digests written now would vouch for whatever the memory
// file holds after the reboot); it stays asleep, its record says why,
// and it wakes when next used.
func (g *integrity) sealPending(ctx context.Context, vm registry.VM) {
	if vm.WakeOnBoot && vm.State == registry.StateSleeping && !g.m.cfg.NoDigests {
		g.unmarkUnsealed(ctx, vm.Name)
	}
	dirs := []storage.Path{storage.SuspendDir(vm.Name)}
	if cps, err := g.m.db.ListCheckpoints(ctx, vm.Name); err == nil {
		for _, cp := range cps {
			dirs = append(dirs, checkpoint.Dir(vm.Name, cp.ID))
		}
	}
	for _, d := range dirs {
		host, err := g.m.vol.Path(d)
		if err != nil {
			continue
		}
		if man, err := checkpoint.ReadManifest(host); err == nil && len(man.Large) > 0 {
			g.sealLater(d, snapshotRef{}) // no local copies after a start
		}
	}
}

// reasonUnsealed is the record's reason for a VM the boot wake leaves
// asleep because its memory has no digests.
const reasonUnsealed = "den did not wake it when it started: the memory it slept with got no digests before the host shut down, so den cannot check it; it wakes, unchecked, when next used (or restore a checkpoint: den checkpoints)"

// unmarkUnsealed clears the boot wake's mark of a sleeping VM whose
// suspend slot has memory without digests, and records why.
func (g *integrity) unmarkUnsealed(ctx context.Context, name string) {
	host, err := g.m.vol.Path(storage.SuspendDir(name))
	if err != nil {
		return
	}
	man, err := checkpoint.ReadManifest(host)
	if err != nil || len(man.Large) == 0 {
		return // sealed, or a slot from before digests (restored with a log line)
	}
	_, err = g.m.db.UpdateVM(ctx, name, func(v *registry.VM) error {
		if v.WakeOnBoot && v.State == registry.StateSleeping {
			v.WakeOnBoot, v.Reason = false, reasonUnsealed
		}
		return nil
	})
	if err != nil {
		g.m.log.Warn("den: boot wake: unmark a vm whose memory has no digests", "vm", name, "err", err)
		return
	}
	g.m.log.Warn("den: boot wake: a vm's memory got no digests before the shutdown: left asleep", "vm", name)
}

func notExist(err error) bool { return errors.Is(err, os.ErrNotExist) }

// lifetime is a context that ends when the Manager closes.
func (m *Manager) lifetime() (context.Context, context.CancelFunc) { return until(m.closed) }

// isClosed says whether ch is closed (Close began, for m.closed).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// until is a context that ends when done is closed.
func until(done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// VerifyCheckpoint reads every file of a checkpoint against its digests,
// marks it damaged (or clears the mark) and returns what it found per
// file; the error wraps ErrDamaged when something does not match.
func (m *Manager) VerifyCheckpoint(ctx context.Context, name, id string, progress Progress) ([]checkpoint.FileResult, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if _, err := m.getCheckpoint(ctx, name, id); err != nil {
		return nil, err
	}
	// Under the VM's lock: a checkpoint deleted meanwhile must not read
	// as damaged.
	unlock, err := m.locks.lockVM(ctx, name, "verify "+id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	cp, err := m.getCheckpoint(ctx, name, id)
	if err != nil {
		return nil, err
	}
	progress("verifying checkpoint " + id)
	p := m.integrity.policy(checkpointRef(cp), false)
	p.Full, p.Data = true, m.integrity.dataRanges(ctx)
	res, err := m.snaps.store().Verify(ctx, name, id, p)
	if host, herr := m.vol.Path(checkpoint.Dir(name, id)); herr == nil && (err == nil || errors.Is(err, checkpoint.ErrDamaged)) {
		if kept, kerr, ok := m.integrity.keptResult(ctx, host); ok {
			res = append(res, kept)
			if err == nil {
				err = kerr
			}
		}
	}
	switch {
	case errors.Is(err, checkpoint.ErrDamaged):
		_ = m.snaps.store().MarkDamaged(name, id, err.Error())
	case err == nil:
		_ = m.snaps.store().ClearDamaged(name, id)
	}
	return res, err
}

func baseRef(dir storage.Path, image string) snapshotRef {
	return snapshotRef{dir: dir, what: fmt.Sprintf("the warm base of image %q", image), disk: true}
}

// dropBase moves a warm base that failed verification out of the way (a
// cache: the next create warms a new one); this create boots.
func (b *bases) dropBase(ctx context.Context, dir storage.Path, why error) {
	b.m.log.Error("den: warm base failed verification: booting, and warming a new one next time", "base", string(dir), "err", why)
	b.m.imageMu.Lock()
	defer b.m.imageMu.Unlock()
	bad := storage.Path(string(dir) + "-damaged-" + time.Now().UTC().Format("20060102T150405"))
	if err := b.m.vol.Rename(ctx, dir, bad); err != nil {
		b.m.log.Warn("den: move a damaged warm base aside", "base", string(dir), "err", err)
	}
	b.m.snaps.spares.dropAll(ctx) // clones of its disk
	b.m.snaps.memc.drop(baseCopies, "")
	b.m.gc.poke()
}

// integrity seals snapshots with digests and verifies them before a VM
// runs from one (integrity.go).
type integrity struct{ m *Manager }
