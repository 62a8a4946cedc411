package fsdiff

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// mountTimeout bounds each losetup, mount and umount call: an image on
// a FUSE volume whose daemon hangs must not hang the diff.
const mountTimeout = 30 * time.Second

// Mounted is an ext4 image mounted read-only, its journal not replayed.
type Mounted struct {
	Root string // the mount point
	loop string // the loop device
	dir  string // the temporary directory holding Root
}

// Mount attaches image to a read-only loop device and mounts it
// read-only with noload (the journal is left as it is: nothing is
// written to the image, not even a recovery) under a new directory in
// tmp ("" for the system's). Close undoes both on every path.
func Mount(ctx context.Context, image, tmp string) (_ *Mounted, err error) {
	if _, err := os.Stat(image); err != nil {
		return nil, fmt.Errorf("mount image: %w", err)
	}
	dir, err := os.MkdirTemp(tmp, "den-diff-")
	if err != nil {
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	m := &Mounted{dir: dir}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	out, err := run(ctx, "losetup", "--read-only", "--find", "--show", image)
	if err != nil {
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	m.loop = strings.TrimSpace(out)
	root := dir + "/root"
	if err := os.Mkdir(root, 0o700); err != nil {
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	if _, err := run(ctx, "mount", "-t", "ext4", "-o", "ro,noload,nodev,nosuid,noexec", m.loop, root); err != nil {
		return nil, fmt.Errorf("mount image %s: %w", image, err)
	}
	m.Root = root
	return m, nil
}

// Close unmounts the image (lazily if the mount is busy past its
// bound), detaches the loop device and removes the temporary directory.
// It runs with a context of its own: a cancelled request still cleans up.
func (m *Mounted) Close() error {
	ctx := context.Background()
	var errs []error
	mounted := false
	if m.Root != "" {
		if _, err := run(ctx, "umount", m.Root); err != nil {
			if _, lerr := run(ctx, "umount", "--lazy", m.Root); lerr != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m.Root, err))
				mounted = true
			}
		}
		m.Root = ""
	}
	if m.loop != "" {
		// After a lazy unmount the device is still in use: --detach
		// marks it to be freed once the last user lets go.
		if _, err := run(ctx, "losetup", "--detach", m.loop); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", m.loop, err))
		}
		m.loop = ""
	}
	if m.dir != "" && !mounted {
		if err := os.RemoveAll(m.dir); err != nil {
			errs = append(errs, err)
		}
		m.dir = ""
	}
	return errors.Join(errs...)
}

// run runs a command bounded by mountTimeout, its output in the error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, mountTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
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
