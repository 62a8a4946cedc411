package fsdiff

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// incompatRecover is ext4's needs_recovery feature: the journal holds
// transactions not yet written in place. A memory checkpoint's disk,
// cloned while the guest ran, has it; a disk-only checkpoint's, taken
// with the filesystems frozen, does not.
const incompatRecover = 0x4

// needsRecovery reads an ext4 image's superblock (at 1024 bytes; its
// incompatible features at 0x60).
func needsRecovery(image string) (bool, error) {
	f, err := os.Open(image)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return false, fmt.Errorf("read superblock of %s: %w", image, err)
	}
	if binary.LittleEndian.Uint16(sb[0x38:]) != 0xEF53 {
		return false, fmt.Errorf("%s holds no ext4 filesystem", image)
	}
	return binary.LittleEndian.Uint32(sb[0x60:])&incompatRecover != 0, nil
}

// prepare returns the image to mount for image: itself, or, when its
// journal must be replayed (a read-only noload mount would miss what the
// journal holds), a copy (Options.Copy) with the journal replayed into
// it; done removes the copy.
func prepare(ctx context.Context, image string, opts Options) (string, func(), error) {
	need, err := needsRecovery(image)
	if err != nil || !need {
		return image, func() {}, err
	}
	if opts.Copy == nil {
		return "", nil, fmt.Errorf("%s: its journal needs replaying and no copy can be made", image)
	}
	cp, remove, err := opts.Copy(ctx, image)
	if err != nil {
		return "", nil, fmt.Errorf("copy %s to replay its journal: %w", image, err)
	}
	ctx, cancel := context.WithTimeout(ctx, mountTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "e2fsck", "-E", "journal_only", "-p", cp)
	cmd.WaitDelay = waitDelay
	out, err := cmd.CombinedOutput()
	// 1: errors corrected (the journal replayed).
	if exit, ok := errors.AsType[*exec.ExitError](err); err != nil && !(ok && exit.ExitCode() == 1) {
		remove()
		return "", nil, fmt.Errorf("replay the journal of a copy of %s: e2fsck: %w: %s", image, err, out)
	}
	return cp, remove, nil
}
