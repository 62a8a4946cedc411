package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/memstore"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/vmm"
)

// Memory kept by content. A VMM whose guest RAM is a file on the host
// (vmm.MemoryKeeper: QEMU) writes only its devices' state into a
// snapshot; den stores the memory in the volume's memory store
// (package memstore) and writes its manifest beside the state. A new
// snapshot shares every extent its VM's memory origin (the snapshot the
// RAM last equalled: what a restore read, or what the last snapshot
// wrote) holds, and writes the rest into one new pack: an idle VM's
// checkpoint stores the few MiB it changed, not its RAM. A restore fills
// the RAM file from the local copy of the memory when there is one, else
// from the store, each extent checked against its digest. Snapshots with
// a memory file of their own (taken before, by another VMM, or with
// Config.MemoryFiles) are read as they always were.

// keptStore opens the volume's memory store once.
type keptStore struct {
	mu sync.Mutex
	s  *memstore.Store
}

// memStore is the volume's memory store.
func (ss *snapshots) memStore() (*memstore.Store, error) {
	ss.kept.mu.Lock()
	defer ss.kept.mu.Unlock()
	if ss.kept.s != nil {
		return ss.kept.s, nil
	}
	root, err := ss.m.vol.Path(storage.MemoryStoreDir())
	if err != nil {
		return nil, err
	}
	s, err := memstore.Open(root)
	if err != nil {
		return nil, err
	}
	s.Hook = func(step string) { crashpoint("memstore-" + step) }
	ss.kept.s = s
	return s, nil
}

// keeper is hv as a VMM whose memory den keeps by content; nil when it
// is not one (or its RAM is in its state stream, or Config.MemoryFiles).
func (ss *snapshots) keeper(hv vmm.Hypervisor) vmm.MemoryKeeper {
	if ss.m.cfg.MemoryFiles {
		return nil
	}
	mk, ok := hv.(vmm.MemoryKeeper)
	if !ok || mk.RAMFile() == "" {
		return nil
	}
	return mk
}

// snapshotKept writes the paused VM's snapshot into host (a directory
// on the volume) with its memory kept by content, sharing with the
// snapshot in the directory origin ("" for none), of whose memory
// originCopy is a local copy ("" for none): the extents the RAM holds as
// the copy does are known by their digests there, not hashed again.
func (ss *snapshots) snapshotKept(ctx context.Context, name string, mk vmm.MemoryKeeper, host, origin, originCopy string) error {
	if err := mk.SnapshotDevices(ctx, host); err != nil {
		return err
	}
	store, err := ss.memStore()
	if err != nil {
		return fmt.Errorf("snapshot vm %q: memory store: %w", name, err)
	}
	so := memstore.SaveOptions{Origin: origin, OriginCopy: originCopy}
	if ext, err := mk.MemoryRanges(host); err == nil {
		so.Ranges = ext // the RAM's data ranges the VMM just read (nil: asked again)
	}
	end := phase.Begin(ctx, "store the memory by content")
	_, st, err := store.Save(ctx, mk.RAMFile(), host, so)
	end()
	if err != nil {
		return fmt.Errorf("snapshot vm %q: %w", name, err)
	}
	ss.m.log.Debug("den: snapshot memory stored by content", "vm", name, "extents", st.Extents, "shared", st.Reused, "written_bytes", st.Written)
	return nil
}

// originDir is the host path of in's memory origin's snapshot
// directory, "" for none.
func (ss *snapshots) originDir(in *instance) string {
	o := in.origin.get()
	if o.dir == "" {
		return ""
	}
	p, err := ss.m.vol.Path(o.dir)
	if err != nil {
		return ""
	}
	return p
}

// fillMemory fills dst, a RAM file, with the memory of the VMM snapshot
// in the directory host, from the store, checking each extent; or first,
// when pc names one, from another host's local copy (fillFromPeer). A
// damaged extent fails it before the guest runs, and marks every
// checkpoint whose memory shares it (markSharers).
func (ss *snapshots) fillMemory(ctx context.Context, host, dst string, pc peerCopy) error {
	man, err := memstore.ReadManifest(host)
	if err != nil {
		return err
	}
	if ss.fillFromPeer(ctx, man, dst, pc) {
		return nil
	}
	store, err := ss.memStore()
	if err != nil {
		return err
	}
	if err := store.Fill(ctx, man, dst); err != nil {
		var d memstore.Damage
		if errors.As(err, &d) {
			err = damaged{err}
			ss.m.integrity.markSharers([]memstore.Damage{d}, err)
			return err
		}
		if errors.Is(err, memstore.ErrDamaged) {
			return damaged{err}
		}
		return err
	}
	return nil
}

// damaged is damage found in memory kept by content: it reads as
// checkpoint.ErrDamaged, as damage in a snapshot's own files does.
type damaged struct{ error }

func (d damaged) Is(target error) bool { return target == checkpoint.ErrDamaged }
func (d damaged) Unwrap() error        { return d.error }

// memoryDir is the host path of ref's VMM snapshot directory.
func (r snapshotRef) memoryDir(host string) string {
	if r.disk {
		return filepath.Join(host, checkpoint.VMMDir)
	}
	return host
}

// verifyKept checks the memory ref keeps by content, if it does: its
// local copy when it has one (a damaged copy is dropped, and the store
// checked instead), else every extent in the store. A checkpoint marked
// damaged is checked in the store whatever its local copy holds: an
// extent it shares with a snapshot found damaged may be the damaged one.
func (g *integrity) verifyKept(ctx context.Context, ref *snapshotRef, host string) error {
	man, err := memstore.ReadManifest(ref.memoryDir(host))
	if errors.Is(err, memstore.ErrNoManifest) {
		return nil
	}
	if err != nil {
		return damaged{err}
	}
	marked := ref.id != "" && g.m.snaps.store().Damaged(ref.vm, ref.id) != ""
	if ref.local != "" && !marked {
		if sums := g.m.snaps.memc.sumsOf(ref.local); sums != nil && memstore.CheckCopy(ctx, man, ref.local, sums) {
			return nil // as it was made, from the RAM the manifest was made from
		}
		err := memstore.VerifyCopy(ctx, man, ref.local)
		if err == nil || ctx.Err() != nil {
			return err
		}
		g.m.log.Warn("den: a local memory copy failed verification: dropped", "snapshot", ref.what, "err", err)
		_ = os.Remove(ref.local)
		ref.local = ""
	}
	if ref.filled && !marked {
		return nil // the fill checks each extent it reads (fillMemory)
	}
	return g.verifyStored(ctx, man)
}

// verifyStored reads every extent man names from the store. Damage
// found marks every checkpoint whose memory names a damaged extent.
func (g *integrity) verifyStored(ctx context.Context, man *memstore.Manifest) error {
	store, err := g.m.snaps.memStore()
	if err != nil {
		return err
	}
	bad, err := store.Verify(ctx, man)
	if err != nil {
		return err
	}
	if len(bad) == 0 {
		return nil
	}
	more := ""
	if len(bad) > 1 {
		more = fmt.Sprintf(" (and %d more extents)", len(bad)-1)
	}
	err = damaged{fmt.Errorf("%w%s", bad[0], more)}
	g.markSharers(bad, err)
	return err
}

// markSharers marks damaged every checkpoint whose memory names one of
// the damaged extents: a damaged extent stored once is damage in every
// snapshot that shares it.
func (g *integrity) markSharers(bad []memstore.Damage, why error) {
	hit := map[memstore.Digest]bool{}
	for _, d := range bad {
		hit[d.Digest] = true
	}
	roots, err := g.m.gc.roots()
	if err != nil {
		return
	}
	paths, err := memstore.FindAllManifests(roots...)
	if err != nil {
		g.m.log.Warn("den: find the snapshots that share a damaged extent: only the one verified is marked", "err", err)
		return
	}
	for _, p := range paths {
		vm, cp := snapshotOwner(roots[0], p)
		if vm == "" || cp == "" {
			continue
		}
		man, err := memstore.ReadManifest(filepath.Dir(p))
		if err != nil {
			continue
		}
		for _, e := range man.Extents {
			if hit[e.Digest] {
				if merr := g.m.snaps.store().MarkDamaged(vm, cp, "shares a damaged memory extent: "+why.Error()); merr != nil {
					g.m.log.Warn("den: mark a checkpoint damaged", "vm", vm, "checkpoint", cp, "err", merr)
				}
				break
			}
		}
	}
}

// keptResult is what verifying the memory a checkpoint keeps by content
// found, as a line of den checkpoint verify; ok false: nothing kept.
func (g *integrity) keptResult(ctx context.Context, host string) (checkpoint.FileResult, error, bool) {
	man, err := memstore.ReadManifest(filepath.Join(host, checkpoint.VMMDir))
	if errors.Is(err, memstore.ErrNoManifest) {
		return checkpoint.FileResult{}, nil, false
	}
	res := checkpoint.FileResult{File: checkpoint.VMMDir + "/memory", Detail: "by content", Status: "ok"}
	if err != nil {
		err = damaged{err}
		res.Status, res.Detail = "damaged", err.Error()
		return res, err, true
	}
	res.Size, res.Extents, res.Of, res.ReadBytes = man.Size, len(man.Extents), len(man.Extents), man.Bytes()
	if err := g.verifyStored(ctx, man); err != nil {
		res.Status, res.Detail = "damaged", err.Error()
		if !errors.Is(err, checkpoint.ErrDamaged) {
			res.Status = "error"
		}
		return res, err, true
	}
	return res, nil, true
}

// keptBytes is the memory data the snapshot in the VMM directory host
// keeps by content; ok false: it keeps none.
func keptBytes(host string) (int64, bool) {
	man, err := memstore.ReadManifest(host)
	if err != nil {
		return 0, false
	}
	return man.Bytes(), true
}
