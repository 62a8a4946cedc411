// Package checkpoint keeps VM checkpoints on the storage volume: their
// layout, the write-then-rename that makes a checkpoint appear only when
// complete, their lineage and their retention.
package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/storage"
)

// Record is a checkpoint's catalog row, kept in the registry and in the
// checkpoint's meta.json.
type Record struct {
	VM          string    `json:"vm"`
	ID          string    `json:"id"`
	Seq         int       `json:"seq"`
	Parent      string    `json:"parent,omitempty"`
	Kind        string    `json:"kind"`
	Comment     string    `json:"comment,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	MemoryBytes int64     `json:"memory_bytes"`
	DiskBytes   int64     `json:"disk_bytes"`
	VMM         string    `json:"vmm,omitempty"`
	// Seal is the id of the checkpoint's digests (Manifest.Seal): once
	// recorded, a checkpoint without them is damaged.
	Seal string `json:"seal,omitempty"`
	// Damaged, filled in when listing, says why the checkpoint failed
	// verification (its DamagedFile); it is not part of the catalog.
	Damaged string `json:"-"`
}

// Kinds of checkpoint.
const (
	// KindMemoryDisk holds the VMM's memory and device snapshot and a
	// clone of the disk, taken at one paused instant.
	KindMemoryDisk = "memory+disk"
	// KindDiskOnly holds a clone of the disk taken with the guest's
	// filesystems frozen; restoring it boots.
	KindDiskOnly = "disk-only"
)

// Files of a checkpoint directory.
const (
	DiskFile = "disk"      // clone of the VM's disk
	VMMDir   = "vmm"       // the VMM's snapshot directory (memory+disk only)
	MetaFile = "meta.json" // the catalog row, written last
	// DamagedFile, when present, says why the checkpoint failed
	// verification.
	DamagedFile = "damaged"
)

// ID is the id of a VM's seq'th checkpoint: cp-1, cp-2...
func ID(seq int) string { return fmt.Sprintf("cp-%d", seq) }

// ValidateID checks a checkpoint id typed by a user.
// The rules are validate.CheckpointID's; the error wraps
// validate.ErrInvalid.
func ValidateID(id string) error { return validate.CheckpointID(id) }

// Dir is the volume directory of a complete checkpoint.
func Dir(vm, id string) storage.Path { return storage.CheckpointDir(vm, id) }

func tmpName(id string) string { return "tmp-" + id }

// Store writes and reads checkpoints on a volume.
type Store struct {
	Vol storage.Volume
	// NoDigests leaves new checkpoints without digests (for benchmarks
	// that measure what digests cost).
	NoDigests bool
}

// Pending is a checkpoint being written in a temporary directory.
type Pending struct {
	s   Store
	vm  string
	id  string
	dir storage.Path
}

// Begin starts a checkpoint: an empty temporary directory beside the
// complete ones (a leftover of a crash is removed first).
func (s Store) Begin(ctx context.Context, vm, id string) (*Pending, error) {
	dir := storage.CheckpointsDir(vm).Join(tmpName(id))
	if err := s.Vol.Remove(ctx, dir); err != nil {
		return nil, err
	}
	if err := s.Vol.MkdirAll(ctx, dir); err != nil {
		return nil, fmt.Errorf("begin checkpoint %s of %q: %w", id, vm, err)
	}
	return &Pending{s: s, vm: vm, id: id, dir: dir}, nil
}

// Path is a file of the pending checkpoint, on the volume.
func (p *Pending) Path(file string) storage.Path { return p.dir.Join(file) }

// HostPath is a file of the pending checkpoint on the host.
func (p *Pending) HostPath(file string) (string, error) { return p.s.Vol.Path(p.dir.Join(file)) }

// Sync checks that the pending checkpoint is whole (a disk, and for a
// memory+disk checkpoint a non-empty VMM snapshot) and flushes every file
// to stable storage: a checkpoint is never reported done before its data
// is durable.
func (p *Pending) Sync() error {
	dir, err := p.s.Vol.Path(p.dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, DiskFile)); err != nil {
		return fmt.Errorf("checkpoint %s of %q has no disk: %w", p.id, p.vm, err)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, VMMDir)); err == nil && len(ents) == 0 {
		return fmt.Errorf("checkpoint %s of %q: the vmm wrote no snapshot", p.id, p.vm)
	}
	if err := atomicfile.SyncTree(dir); err != nil {
		return fmt.Errorf("checkpoint %s of %q: %w", p.id, p.vm, err)
	}
	return nil
}

// SealSmall digests the pending checkpoint's small files (the large ones,
// memory and disk, are left to Store.Seal once it is committed) and
// returns the seal id.
func (p *Pending) SealSmall(ctx context.Context) (string, error) {
	dir, err := p.s.Vol.Path(p.dir)
	if err != nil {
		return "", err
	}
	man, err := SealSmall(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("checkpoint %s of %q: %w", p.id, p.vm, err)
	}
	return man.Seal, nil
}

// Commit writes the catalog row into the directory and renames it into
// place: only now does the checkpoint exist.
func (p *Pending) Commit(ctx context.Context, row Record) error {
	meta, err := p.HostPath(MetaFile)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteJSON(meta, row, 0o600); err != nil {
		return fmt.Errorf("commit checkpoint %s of %q: %w", p.id, p.vm, err)
	}
	if err := p.s.Vol.Rename(ctx, p.dir, Dir(p.vm, p.id)); err != nil {
		return fmt.Errorf("commit checkpoint %s of %q: %w", p.id, p.vm, err)
	}
	return nil
}

// Abort removes the pending checkpoint.
func (p *Pending) Abort() {
	_ = p.s.Vol.Remove(context.Background(), p.dir)
}

// Sweep removes a VM's unfinished checkpoint directories (a crash in the
// middle of one, or of a deletion) and returns the rows of complete
// checkpoint directories, from their meta.json, and the ids whose
// deletion a crash interrupted, so that a catalog can be checked against
// them.
func (s Store) Sweep(ctx context.Context, vm string) (complete []Record, deleted []string, err error) {
	root, err := s.Vol.Path(storage.CheckpointsDir(vm))
	if err != nil {
		return nil, nil, err
	}
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sweep checkpoints of %q: %w", vm, err)
	}
	var out []Record
	for _, e := range ents {
		p := storage.CheckpointsDir(vm).Join(e.Name())
		if strings.HasPrefix(e.Name(), "tmp-") {
			if id, ok := strings.CutPrefix(e.Name(), "tmp-deleted-"); ok {
				deleted = append(deleted, id)
			}
			_ = s.Vol.Remove(ctx, p)
			continue
		}
		row, err := s.Meta(vm, e.Name())
		if err != nil {
			continue
		}
		out = append(out, row)
	}
	return out, deleted, nil
}

// Meta reads a complete checkpoint's meta.json.
func (s Store) Meta(vm, id string) (Record, error) {
	var row Record
	host, err := s.Vol.Path(Dir(vm, id).Join(MetaFile))
	if err != nil {
		return row, err
	}
	data, err := os.ReadFile(host)
	if err != nil {
		return row, fmt.Errorf("checkpoint %s of %q is incomplete: %w", id, vm, err)
	}
	if err := json.Unmarshal(data, &row); err != nil {
		return row, fmt.Errorf("checkpoint %s of %q: corrupt %s: %w", id, vm, MetaFile, err)
	}
	return row, nil
}

// Remove deletes a checkpoint's directory.
func (s Store) Remove(ctx context.Context, vm, id string) error {
	return s.Vol.Remove(ctx, Dir(vm, id))
}

// Retire renames a complete checkpoint's directory out of the way (as an
// unfinished one, which Sweep removes), so that a crash in the middle of
// a deletion never brings the checkpoint back; RemoveRetired then frees
// its space.
func (s Store) Retire(ctx context.Context, vm, id string) error {
	host, err := s.Vol.Path(Dir(vm, id))
	if err != nil {
		return err
	}
	if _, err := os.Stat(host); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := s.Vol.Rename(ctx, Dir(vm, id), retired(vm, id)); err != nil {
		return fmt.Errorf("delete checkpoint %s of %q: %w", id, vm, err)
	}
	return nil
}

// RemoveRetired removes a retired checkpoint's files.
func (s Store) RemoveRetired(ctx context.Context, vm, id string) error {
	return s.Vol.Remove(ctx, retired(vm, id))
}

func retired(vm, id string) storage.Path { return storage.CheckpointsDir(vm).Join("tmp-deleted-" + id) }
