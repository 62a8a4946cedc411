package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/denhq/den/internal/atomicfile"
)

// Verify checks a checkpoint's files against their digests as p says;
// damage is an error wrapping ErrDamaged that names the checkpoint, the
// file and the extent.
func (s Store) Verify(ctx context.Context, vm, id string, p Policy) ([]FileResult, error) {
	dir, err := s.Vol.Path(Dir(vm, id))
	if err != nil {
		return nil, err
	}
	res, err := Verify(ctx, dir, p)
	if err != nil {
		return res, VerifyError(fmt.Sprintf("checkpoint %s of %q", id, vm), err)
	}
	return res, nil
}

// VerifyError words an error of Verify for the snapshot it checked: a
// damaged one as "WHAT is damaged: ...".
func VerifyError(what string, err error) error {
	if errors.Is(err, ErrDamaged) {
		return fmt.Errorf("%s is damaged: %w", what, err)
	}
	return fmt.Errorf("verify %s: %w", what, err)
}

// MarkDamaged records in the checkpoint why it failed verification.
func (s Store) MarkDamaged(vm, id, why string) error {
	host, err := s.Vol.Path(Dir(vm, id).Join(DamagedFile))
	if err != nil {
		return err
	}
	return atomicfile.Write(host, []byte(why+"\n"), 0o600)
}

// ClearDamaged removes the mark (a verification that passed).
func (s Store) ClearDamaged(vm, id string) error {
	host, err := s.Vol.Path(Dir(vm, id).Join(DamagedFile))
	if err != nil {
		return err
	}
	if err := os.Remove(host); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Damaged is why the checkpoint was marked damaged, or "".
func (s Store) Damaged(vm, id string) string {
	host, err := s.Vol.Path(Dir(vm, id).Join(DamagedFile))
	if err != nil {
		return ""
	}
	b, err := os.ReadFile(host)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
