package fsdiff

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mountTimeout bounds each losetup, mount and umount call: an image on
// a FUSE volume whose daemon hangs must not hang the diff.
const mountTimeout = 30 * time.Second

// waitDelay bounds the wait for a killed command's output.
const waitDelay = time.Second

// Mounted is an ext4 image mounted read-only, its journal not replayed.
type Mounted struct {
	Root string // the mount point
	dir  string // the temporary directory holding Root
	// drop removes the copy whose journal was replayed (Open).
	drop func()
}

// Open mounts image read-only as Mount does, replaying its journal
// first into a copy (opts.Copy) when it needs it, as Images does; Close
// undoes both.
func Open(ctx context.Context, image string, opts Options) (*Mounted, error) {
	img, drop, err := prepare(ctx, image, opts)
	if err != nil {
		return nil, err
	}
	m, err := Mount(ctx, img, opts.TmpDir)
	if err != nil {
		drop()
		return nil, err
	}
	m.drop = drop
	return m, nil
}

// dirPrefix begins the name of each mount's temporary directory.
const dirPrefix = "den-diff-"

// Mount mounts image read-only with noload (the journal is left as it
// is: nothing is written to the image, not even a recovery) on a
// read-only loop device that mount(8) sets to free itself at unmount,
// under a new directory in tmp ("" for the system's). Close undoes it
// on every path.
func Mount(ctx context.Context, image, tmp string) (_ *Mounted, err error) {
	if _, err := os.Stat(image); err != nil {
		return nil, fmt.Errorf("mount image: %w", err)
	}
	if tmp != "" {
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return nil, fmt.Errorf("mount image %s: %w", image, err)
		}
	}
	dir, err := os.MkdirTemp(tmp, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	m := &Mounted{dir: dir}
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		m.Close()
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	if _, err := run(ctx, "mount", "-t", "ext4", "-o", "loop,ro,noload,nodev,nosuid,noexec,errors=continue", image, root); err != nil {
		// A mount that timed out may still complete: undo it too.
		m.Root = root
		m.Close()
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	m.Root = root
	return m, nil
}

// Close unmounts the image (lazily if the mount is busy) and removes
// the temporary directory; the loop device frees itself. It runs with
// a context of its own: a cancelled request still cleans up.
func (m *Mounted) Close() error {
	if m.Root != "" {
		if err := unmount(m.Root); err != nil {
			return err // the directory stays: it is still a mount point
		}
		m.Root = ""
	}
	if m.dir != "" {
		if err := os.RemoveAll(m.dir); err != nil {
			return fmt.Errorf("unmount: %w", err)
		}
		m.dir = ""
	}
	if m.drop != nil {
		m.drop()
		m.drop = nil
	}
	return nil
}

// unmount unmounts root if it is a mount point, lazily if it is busy.
func unmount(root string) error {
	if !mounted(root) {
		return nil
	}
	_, err := run(context.Background(), "umount", root)
	if err != nil && mounted(root) {
		if _, lerr := run(context.Background(), "umount", "--lazy", root); lerr != nil {
			return fmt.Errorf("unmount %s: %w", root, err)
		}
	}
	return nil
}

// mounted says whether p is a mount point (its device differs from its
// parent's).
func mounted(p string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(p, &st) != nil || unix.Lstat(filepath.Dir(p), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// Sweep undoes the mounts a process that ended mid-diff left in tmp
// (the directory given to Mount): run it before any diff starts.
func Sweep(tmp string) error {
	dirs, err := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		m := &Mounted{Root: filepath.Join(d, "root"), dir: d}
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// run runs a command bounded by mountTimeout, its output in the error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, mountTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = waitDelay
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if ctx.Err() != nil {
			msg = "timed out after " + mountTimeout.String()
		}
		return "", fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return string(out), nil
}
