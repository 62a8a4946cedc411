package registry

import (
	"fmt"
	"regexp"

	"github.com/denhq/den/internal/validate"
)

// The registry refuses to store what den's validation layer
// (internal/validate) would refuse at the CLI, the API and the gateway:
// a last line of defence, so that a caller that forgot a check cannot
// write a path, a NUL byte or a megabyte into a record. The errors wrap
// validate.ErrInvalid.

// checkVM checks a VM record's names.
func checkVM(vm VM) error {
	if err := validate.VMName(vm.Name); err != nil {
		return fmt.Errorf("record vm: %w", err)
	}
	if err := validate.User(vm.Owner); err != nil {
		return fmt.Errorf("record vm %q: owner: %w", vm.Name, err)
	}
	if err := validate.Image(vm.Image); err != nil {
		return fmt.Errorf("record vm %q: %w", vm.Name, err)
	}
	return nil
}

// checkCheckpoint checks a checkpoint row's names and comment.
func checkCheckpoint(c Checkpoint) error {
	if err := validate.VMName(c.VM); err != nil {
		return fmt.Errorf("record checkpoint: %w", err)
	}
	if err := validate.CheckpointID(c.ID); err != nil {
		return fmt.Errorf("record checkpoint of %q: %w", c.VM, err)
	}
	if c.Parent != "" {
		if err := validate.CheckpointID(c.Parent); err != nil {
			return fmt.Errorf("record checkpoint %s of %q: parent: %w", c.ID, c.VM, err)
		}
		if c.Parent == c.ID {
			return fmt.Errorf("record checkpoint %s of %q: it cannot be its own parent: %w", c.ID, c.VM, validate.ErrInvalid)
		}
	}
	if err := validate.Comment(c.Comment); err != nil {
		return fmt.Errorf("record checkpoint %s of %q: %w", c.ID, c.VM, err)
	}
	return nil
}

// checkKey checks a key's user, name and length.
func checkKey(k Key) error {
	if err := validate.User(k.User); err != nil {
		return fmt.Errorf("record key %s: %w", k.Fingerprint, err)
	}
	if err := validate.KeyName(k.Name); err != nil {
		return fmt.Errorf("record key %s: %w", k.Fingerprint, err)
	}
	if err := validate.PublicKey(k.PublicKey); err != nil {
		return fmt.Errorf("record key %s: %w", k.Fingerprint, err)
	}
	return nil
}

// checkToken checks a token's id, user, name and hash.
func checkToken(t Token) error {
	if err := validate.TokenID(t.ID); err != nil {
		return fmt.Errorf("record token: %w", err)
	}
	if err := validate.User(t.User); err != nil {
		return fmt.Errorf("record token %s: %w", t.ID, err)
	}
	if err := validate.TokenName(t.Name); err != nil {
		return fmt.Errorf("record token %s: %w", t.ID, err)
	}
	if !hexSHA256.MatchString(t.Hash) {
		return fmt.Errorf("record token %s: the hash is not a hex sha-256: %w", t.ID, validate.ErrInvalid)
	}
	return nil
}

// hexSHA256 is a SHA-256 digest in lower-case hex.
var hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)

func checkHostName(name string) error {
	if err := validate.HostName(name); err != nil {
		return fmt.Errorf("record host: %w", err)
	}
	return nil
}
