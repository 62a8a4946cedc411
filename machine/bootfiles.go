package machine

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"github.com/denhq/den/internal/sparse"
	"github.com/denhq/den/storage"
)

// bootFiles imports the kernel and the initramfs new VMs boot onto the
// volume, named by the digest of their content (storage.BootFile), and
// VMs boot them from there: every host of a cluster boots a VM with the
// same bytes whatever its own image directory holds, and a rebuild of
// the image directory leaves the VMs made before with the kernel their
// disk was made for.
type bootFiles struct {
	m  *Manager
	mu sync.Mutex // serialises imports; guards known
	// known are the digests of the image directory's files, by path,
	// with the size and time they were taken at.
	known map[string]bootDigest
}

type bootDigest struct {
	size   int64
	mtime  time.Time
	digest string
}

// importFile returns the volume path of the host file path's content,
// imported when the volume does not hold it yet.
func (b *bootFiles) importFile(ctx context.Context, path string, progress Progress) (storage.Path, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	digest, err := b.digest(path)
	if err != nil {
		return "", fmt.Errorf("boot file: %w", err)
	}
	p := storage.BootFile(digest, filepath.Base(path))
	host, err := b.m.vol.Path(p)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(host); err == nil {
		return p, nil
	}
	progress("importing " + filepath.Base(path) + " onto the volume (once per build)")
	if err := b.m.vol.MkdirAll(ctx, storage.BootDir(digest)); err != nil {
		return "", fmt.Errorf("import %s: %w", path, err)
	}
	// A name of its own: another host may import the same file now.
	tmp := storage.BootFile(digest, fmt.Sprintf("%s.tmp-%d-%d", filepath.Base(path), os.Getpid(), time.Now().UnixNano()))
	tmpHost, err := b.m.vol.Path(tmp)
	if err != nil {
		return "", err
	}
	err = sparse.Copy(path, tmpHost)
	if err == nil {
		err = os.Chmod(tmpHost, 0o644) // the VMMs' own user reads it
	}
	if err == nil {
		err = b.m.vol.Rename(ctx, tmp, p)
	}
	if err != nil {
		_ = b.m.vol.Remove(ctx, tmp)
		return "", fmt.Errorf("import %s: %w", path, err)
	}
	return p, nil
}

// digest is the hex BLAKE3-256 of the file at path, read again only when
// its size or time changed.
func (b *bootFiles) digest(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if k, ok := b.known[path]; ok && k.size == st.Size() && k.mtime.Equal(st.ModTime()) {
		return k.digest, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := blake3.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	d := hex.EncodeToString(h.Sum(nil))
	if b.known == nil {
		b.known = map[string]bootDigest{}
	}
	b.known[path] = bootDigest{size: st.Size(), mtime: st.ModTime(), digest: d}
	return d, nil
}

// bootPaths are the host paths of the kernel and initramfs a VM boots:
// those on the volume for a VM made since den imports them, else the
// image directory's it was made with.
func (l *launcher) bootPaths(sp spec) (kernel, initramfs string, err error) {
	kernel, initramfs = sp.Kernel, sp.Initramfs
	if sp.KernelFile != "" {
		if kernel, err = l.m.vol.Path(storage.Path(sp.KernelFile)); err != nil {
			return "", "", err
		}
	}
	if sp.InitramfsFile != "" {
		if initramfs, err = l.m.vol.Path(storage.Path(sp.InitramfsFile)); err != nil {
			return "", "", err
		}
	}
	return kernel, initramfs, nil
}
