package machine

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/memstore"
)

// MemoryRequest is what a host of a cluster asks another for: extents of
// its local copy of a sleeping VM's memory, to wake the VM with.
type MemoryRequest struct {
	VM string `json:"vm"`
	// Key names the copy there (suspendKey: the sleep's seal).
	Key string `json:"key"`
	// Size is the memory's size in bytes.
	Size int64 `json:"size"`
	// Extents are the extents' indexes, in the order they are sent.
	Extents []int64 `json:"extents"`
}

// Bytes is how many bytes the extents req names hold (those outside the
// memory hold none: the request is refused).
func (req MemoryRequest) Bytes() int64 {
	var n int64
	for _, i := range req.Extents {
		if e := (memstore.Extent{Index: i}); i >= 0 && e.Off() < req.Size {
			n += e.Len(req.Size)
		}
	}
	return n
}

// LocalMemory serves this host's local copies of sleeping VMs' memory to
// the cluster's other hosts: a host that wakes a VM this host put to
// sleep reads its memory here, checking each extent against the digests
// on the volume, rather than through the volume.
type LocalMemory struct{ ss *snapshots }

// LocalMemory is this host's local copies of memory, for its peers.
func (m *Manager) LocalMemory() LocalMemory { return LocalMemory{&m.snaps} }

// Send writes the extents req names of this host's local copy to w,
// back to back; ErrNotFound when it has none.
func (l LocalMemory) Send(ctx context.Context, req MemoryRequest, w io.Writer) error {
	if err := ValidateName(req.VM); err != nil {
		return fmt.Errorf("local memory copy: %w", err)
	}
	if n := (req.Size + memstore.ExtentSize - 1) / memstore.ExtentSize; req.Size <= 0 || int64(len(req.Extents)) > n || slices.ContainsFunc(req.Extents, func(i int64) bool { return i < 0 || i >= n }) {
		return fmt.Errorf("local memory copy of vm %q: extents outside a memory of %d bytes, or more of them than it has: %w", req.VM, req.Size, ErrInvalid)
	}
	if !strings.HasPrefix(req.Key, "suspend-") || strings.ContainsAny(req.Key, `/\`) || strings.Contains(req.Key, "..") {
		return fmt.Errorf("local memory copy %q of vm %q: not a sleep's: %w", req.Key, req.VM, ErrInvalid)
	}
	path := ""
	if l.ss != nil {
		path = l.ss.memc.local(req.VM, req.Key)
	}
	if path == "" {
		return fmt.Errorf("no local copy of the memory vm %q slept with (%s) here: %w", req.VM, req.Key, ErrNotFound)
	}
	return memstore.SendCopy(ctx, path, req.Size, req.Extents, w)
}

// peerCopy names a sleep's local copy of memory on the host that made
// it: the VM, the copy's key there, and the host ("" : none to read).
type peerCopy struct{ vm, key, host string }

// peerStall bounds how long a fill from another host's copy waits for
// its next bytes, after which it gives way to the volume.
const peerStall = 5 * time.Second

// progress is a stream whose every read that brings bytes puts its
// stall timer back to peerStall.
type progress struct {
	io.ReadCloser
	stall *time.Timer
}

func (p progress) Read(b []byte) (int, error) {
	n, err := p.ReadCloser.Read(b)
	if n > 0 {
		p.stall.Reset(peerStall)
	}
	return n, err
}

// fillFromPeer fills dst with the memory man describes from the local
// copy pc names on another host of the cluster (the one that took the
// snapshot), if it names one. Each extent is checked against its digest.
// It says whether it did: false, and the caller fills from the store,
// which writes every extent again.
func (ss *snapshots) fillFromPeer(ctx context.Context, man *memstore.Manifest, dst string, pc peerCopy) bool {
	fetch := ss.m.cfg.FetchMemory
	if fetch == nil || pc.key == "" || pc.host == "" {
		return false
	}
	begin := time.Now()
	want := memstore.Wanted(man)
	req := MemoryRequest{VM: pc.vm, Key: pc.key, Size: man.Size, Extents: make([]int64, len(want))}
	for i, e := range want {
		req.Extents[i] = e.Index
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(peerStall, func() { cancel(fmt.Errorf("no bytes from host %q for %s", pc.host, peerStall)) })
	defer stall.Stop()
	rc, err := fetch(ctx, pc.host, req)
	if err == nil {
		err = memstore.FillFrom(ctx, man, dst, progress{rc, stall})
		rc.Close()
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = cause
		}
		phase.Record(ctx, "fill memory: "+pc.host+"'s local copy failed", time.Since(begin))
		ss.m.log.Info("den: memory not read from the host that slept the vm: read from the volume", "vm", pc.vm, "host", pc.host, "err", err)
		return false
	}
	took := time.Since(begin)
	phase.Record(ctx, "fill memory from "+pc.host+"'s local copy", took)
	ss.m.log.Info("den: memory read from the host that put the vm to sleep", "vm", pc.vm, "host", pc.host, "bytes", req.Bytes(), "took", took.Round(time.Millisecond))
	return true
}
